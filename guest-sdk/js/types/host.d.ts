export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';
export type WireHeader = {
    key: string;
    value: Uint8Array | null;
};
export type HostBackend = {
    /**
     *   Writes one line to the host's log.
     */
    log: (level: Level, message: string) => void;
    /**
     *   Emits one record bound to record `recordIndex` of the batch being judged; throws an
     *   `EmitError` when refused.
     */
    emit: (recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: WireHeader[]) => void;
};
/**
 * Installs the host backend. Called once by the component glue, and by `testing.reset()`.
 * Why a setter: the same SDK code runs natively (tests) and in a component.
 * @param {HostBackend} b
 */
export declare function setBackend(b: HostBackend): void;
/**
 * The installed backend; natively, when nothing was installed, a `FakeHost` that echoes
 * log lines to stderr (so a plugin's logs show up in a test run).
 * @returns {HostBackend}
 */
export declare function getBackend(): HostBackend;
/** The header-key prefix the host keeps for its own (provenance) headers. */
export declare const RESERVED_HEADER_PREFIX = "sharehost.";
/**
 * A stand-in for the host under `node --test`: collects log lines and emits, refuses what the
 * real host refuses (reserved header prefix) and whatever a test's policy refuses. Why: a
 * plugin's unit tests then exercise its emit and error paths without a component.
 */
export declare class FakeHost {
    echo: boolean;
    /** @type {Array<{level: Level, message: string}>} */
    logs: Array<{
        level: Level;
        message: string;
    }>;
    /** @type {Array<{recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: WireHeader[]}>} */
    emits: Array<{
        recordIndex: number;
        output: string;
        key: Uint8Array | null;
        value: Uint8Array | null;
        headers: WireHeader[];
    }>;
    /** @type {((emit: any) => (Error | null | undefined)) | null} */
    policy: ((emit: any) => (Error | null | undefined)) | null;
    /** @param {{echo?: boolean}} [options] echo: also write log lines to stderr. */
    constructor(options?: {
        echo?: boolean;
    });
    /** Records the line (and echoes it to stderr when asked). */
    log(level: any, message: any): void;
    /** Records the emit, or throws what the host (or the test's policy) would refuse with. */
    emit(recordIndex: any, output: any, key: any, value: any, headers: any): void;
}

/**
 * Write a sharehost plugin in JavaScript.
 *
 * A plugin judges records fetched from a Kafka share group: for each record it returns a
 * verdict (`accept()`, `release()`, `reject(reason)`, `renew()`, `retry(afterMs)`). You write a
 * class (or an object) with `init(config)` and `handle(record)`; this SDK hides the
 * contract's columnar batch (spans into one byte buffer, 0xffffffff for null, BigInt offsets)
 * behind `Record` objects whose `key`, `value` and `headers` are decoded only when read.
 * The same code runs under `node --test` (no WebAssembly: see `@sharehost/guest/testing`) and,
 * built with `sharehost-build-js`, as a component of contract `sharehost:plugin@0.2.0`.
 *
 * ```js
 * import { Plugin, accept, reject } from '@sharehost/guest';
 *
 * export default class SizeLimit extends Plugin {
 *   init(config) {
 *     this.max = Number.parseInt(config.get('max-bytes', '1024'), 10);
 *     if (!Number.isSafeInteger(this.max)) throw new Error('max-bytes: not an integer');
 *   }
 *   handle(record) {
 *     return record.value !== null && record.value.length > this.max
 *       ? reject('value too large')
 *       : accept();
 *   }
 * }
 * ```
 *
 * State: the host creates a fresh instance (calls `init`) on every new plugin instance and
 * then hands it batch after batch, so fields of `this` live across batches: use them for
 * caches and counters. Instances are recycled (after N batches and after any fault), so
 * never keep state there that must survive.
 *
 * @module @sharehost/guest
 */
export { EmitError } from './errors.js';
export { RESERVED_HEADER_PREFIX } from './host.js';
export type Verdict = {
    kind: 'accept';
} | {
    kind: 'release';
} | {
    kind: 'renew';
} | {
    kind: 'reject';
    reason: string | null;
} | {
    kind: 'retry';
    afterMs: number;
};
/**
 * Processed: acknowledge the record; it is never delivered again.
 * @returns {Verdict}
 */
export declare function accept(): Verdict;
/**
 * Not processed now: hand the record back for redelivery (to any consumer of the group).
 * @returns {Verdict}
 */
export declare function release(): Verdict;
/**
 * Still working on it: keep the acquisition lock (KIP-932 renew) and deliver the record
 * here again later.
 * @returns {Verdict}
 */
export declare function renew(): Verdict;
/**
 * Unprocessable: never deliver the record again (dead-lettered when the pipeline has a
 * dead-letter topic). The reason is logged and travels with the dead letter; the host
 * bounds its length.
 * @param {string | null} [reason]
 * @returns {{kind: 'reject', reason: string | null}}
 */
export declare function reject(reason?: string | null): {
    kind: 'reject';
    reason: string | null;
};
/**
 * Not now, try again after `afterMs` milliseconds: the host keeps the record acquired and
 * releases it for redelivery when the delay has passed, so a plugin facing a 429 or a down
 * dependency backs off instead of spinning through deliveries. The host caps the delay
 * (`max_retry_delay_ms`); the record's emits are discarded. Fractions are rounded down,
 * delays past 2^32-1 ms (about 49 days) saturate; a negative or non-numeric delay throws.
 * @param {number} afterMs
 * @returns {{kind: 'retry', afterMs: number}}
 */
export declare function retry(afterMs: number): {
    kind: 'retry';
    afterMs: number;
};
/**
 * The pipeline's configuration: the manifest's key/value pairs, in order, and apart from
 * them its secrets (`[pipeline.secrets]`). Secrets are kept out of `get`, `entries` and
 * `JSON.stringify`/`console.log` so that code dumping the configuration never dumps them.
 */
export declare class Config {
    #private;
    /**
     * @param {Iterable<[string, string]> | {[key: string]: string}} [pairs]
     * @param {Iterable<[string, string]> | {[key: string]: string}} [secrets]
     */
    constructor(pairs?: Iterable<[string, string]> | {
        [key: string]: string;
    }, secrets?: Iterable<[string, string]> | {
        [key: string]: string;
    });
    /**
     * The value of the last pair named `key` (later entries override earlier ones), or
     * `fallback` (default `undefined`) when there is none.
     * @template [T=undefined]
     * @param {string} key
     * @param {T} [fallback]
     * @returns {string | T}
     */
    get<T = undefined>(key: string, fallback?: T): string | T;
    /**
     * Whether a pair named `key` exists.
     * @param {string} key
     */
    has(key: string): any;
    /**
     * The secret named `name` (from `[pipeline.secrets]`), e.g. an API token, or `undefined`.
     * Keep it out of logs, reasons and emits yourself.
     * @param {string} name
     * @returns {string | undefined}
     */
    secret(name: string): string | undefined;
    /**
     * All pairs, in order (secrets not included).
     * @returns {Array<[string, string]>}
     */
    entries(): Array<[string, string]>;
    /** Pairs plus the secrets' names only, so logging a Config never leaks a secret. */
    toJSON(): {
        pairs: [string, string][];
        secrets: any;
    };
}
/**
 * Formats `console.log`-style arguments as one line: strings as they are, errors with their
 * stack, other values as JSON (BigInt and byte arrays included). Why: the host's log takes
 * one string per line.
 * @param {unknown[]} args
 * @returns {string}
 */
export declare function format(...args: unknown[]): string;
/**
 * Logging to the host's log, tagged with the plugin's name. Each call writes one line
 * (arguments formatted like `console.log`). The host bounds it: a message over 4 KiB is
 * truncated, a batch may log at most 256 messages; the rest are dropped and counted.
 * Inside a component `console.log/info` go to `info`, `console.debug` to `debug`,
 * `console.warn` to `warn`, `console.error` to `error`, `console.trace` to `trace`.
 * Natively (tests) lines go to the `testing` fake host (and to stderr unless a test reset it).
 */
export declare const log: Readonly<{
    /** Very detailed tracing. */
    trace: (...args: any[]) => void;
    /** Debugging detail. */
    debug: (...args: any[]) => void;
    /** Normal operation. */
    info: (...args: any[]) => void;
    /** Something unusual the operator may want to know. */
    warn: (...args: any[]) => void;
    /** Something failed. */
    error: (...args: any[]) => void;
}>;
/**
 * UTF-8 text of bytes, or `null` for `null` or invalid UTF-8 (like the Rust SDK's
 * `value_str`). A leading BOM is kept, not stripped.
 * @param {Uint8Array | null} bytes
 * @returns {string | null}
 */
export declare function text(bytes: Uint8Array | null): string | null;
export type WireBatch = {
    topics: string[];
    topicIndex: ArrayLike<number>;
    partitions: ArrayLike<number>;
    offsets: ArrayLike<bigint>;
    timestamps: ArrayLike<bigint>;
    deliveryCounts: ArrayLike<number>;
    keySpans: ArrayLike<number>;
    valueSpans: ArrayLike<number>;
    headerRanges: ArrayLike<number>;
    headerSpans: ArrayLike<number>;
    data: Uint8Array;
};
export type Header = {
    key: string;
    value: Uint8Array | null;
};
/**
 * One record of a batch. `key`, `value` and `headers` are decoded from the batch only when
 * read, as `Uint8Array` views into the batch buffer (`null` is a null key/value, distinct
 * from an empty one). Views pin the whole batch buffer: to keep bytes past this batch,
 * copy them (`record.value.slice()`).
 *
 * `offset` and `timestamp` are plain numbers, exact up to 2^53 (9,007,199,254,740,992);
 * `offsetBigInt` and `timestampBigInt` are always exact.
 */
export declare class Record {
    #private;
    /**
     * Records are made by the SDK from a batch (and by `testing.record` in tests).
     * @param {WireBatch} batch
     * @param {number} index
     */
    constructor(batch: WireBatch, index: number);
    /** The record's position in its batch (0-based): what binds an emit to this record. */
    get index(): any;
    /** The topic the record was fetched from. */
    get topic(): any;
    /** The partition the record was fetched from. */
    get partition(): any;
    /** The record's offset in its partition (a number: exact up to 2^53; see `offsetBigInt`). */
    get offset(): number;
    /** The record's offset, exact. */
    get offsetBigInt(): bigint;
    /** Record timestamp, milliseconds since the Unix epoch (a number; `new Date(record.timestamp)`). */
    get timestamp(): number;
    /** Record timestamp, exact. */
    get timestampBigInt(): bigint;
    /** How many times the broker has delivered this record, including now (1 = first time). */
    get deliveryCount(): any;
    /**
     * A name for this record that is the same at every delivery, `TOPIC/PARTITION/OFFSET`: hand it
     * to a service the plugin calls (an `Idempotency-Key` header) so that a call made again after
     * a redelivery does its work once. The host cannot undo a call outside Kafka, even in an
     * exactly-once pipeline; the service can, with this key.
     * @returns {string}
     */
    get idempotencyKey(): string;
    /**
     * The key bytes, or `null` for a null key.
     * @returns {Uint8Array | null}
     */
    get key(): Uint8Array | null;
    /**
     * The value bytes, or `null` for a null value (a tombstone).
     * @returns {Uint8Array | null}
     */
    get value(): Uint8Array | null;
    /**
     * Headers in order (keys may repeat).
     * @returns {ReadonlyArray<Header>}
     */
    get headers(): ReadonlyArray<Header>;
    /** The key as UTF-8 text; `null` when null or not valid UTF-8. */
    keyText(): string | null;
    /** The value as UTF-8 text; `null` when null (a tombstone) or not valid UTF-8. */
    valueText(): string | null;
    /**
     * The value of the first header named `name`: `undefined` when absent, `null` when present
     * with a null value.
     * @param {string} name
     * @returns {Uint8Array | null | undefined}
     */
    header(name: string): Uint8Array | null | undefined;
    /**
     * The first header named `name` as UTF-8 text: `undefined` when absent, `null` when null
     * or not valid UTF-8.
     * @param {string} name
     * @returns {string | null | undefined}
     */
    headerText(name: string): string | null | undefined;
    /**
     * Emits a record to the topic the manifest maps `output` to (`[pipeline.outputs]`), bound
     * to this record: the host produces it (acks=all) before this record's accept goes out,
     * and discards it if this record ends released, rejected, renewed or retried. So emit
     * first, then return `accept()`.
     *
     * `key` and `value`: bytes, text (sent as UTF-8) or `null`/omitted (a null key/value).
     * `headers`: `[{key, value}]`, `[[key, value]]` or `{key: value}`; header keys may not
     * start with `sharehost.` (the host adds `sharehost.source.*` provenance headers).
     *
     * Throws an `EmitError` (with `kind` and `detail`) when the host refuses: the emit is not
     * produced and never will be; what that means for the record is the plugin's call.
     *
     * @param {string} output
     * @param {{key?: Uint8Array | string | null, value?: Uint8Array | string | null,
     *   headers?: Array<Header | [string, Uint8Array | string | null]> | {[key: string]: Uint8Array | string | null}}} [message]
     */
    emit(output: string, message?: {
        key?: Uint8Array | string | null;
        value?: Uint8Array | string | null;
        headers?: Array<Header | [string, Uint8Array | string | null]> | {
            [key: string]: Uint8Array | string | null;
        };
    }): void;
    /** A plain summary for logs and test failures (bytes shown as text when UTF-8). */
    toJSON(): {
        index: any;
        topic: any;
        partition: any;
        offset: number;
        timestamp: number;
        deliveryCount: any;
        key: string | Uint8Array<ArrayBufferLike>;
        value: string | Uint8Array<ArrayBufferLike>;
        headers: {
            key: string;
            value: string | Uint8Array<ArrayBufferLike>;
        }[];
    };
}
/**
 * Records of a wire batch (one `Record` per entry of `offsets`), decoded lazily.
 * @param {WireBatch} batch
 * @returns {Record[]}
 */
export declare function recordsOf(batch: WireBatch): Record[];
/**
 * A base class for plugins (optional: any class or object with `handle` or `handleBatch`
 * works). The host calls `init(config)` once per fresh instance, then `handleBatch` per
 * batch; the default `handleBatch` calls `handle(record)` for each record.
 *
 * Fields of `this` live across the batches of one instance (caches, counters); instances
 * are recycled (after N batches and after any fault), so nothing there must need to survive.
 */
export declare class Plugin {
    /**
     * Reads the pipeline configuration. Throw to refuse it: the error's message reaches the
     * host as init's error, and at load the pipeline does not start and shows it (never put a
     * secret in it).
     * @param {Config} _config
     */
    init(_config: Config): void;
    /**
     * Judges one record.
     * @param {Record} _record
     * @returns {Verdict | Promise<Verdict>}
     */
    handle(_record: Record): Verdict | Promise<Verdict>;
    /**
     * Judges a batch: exactly one verdict per record, in order. Override it to work on the
     * batch as a whole.
     * @param {Record[]} records
     * @returns {Array<Verdict | Promise<Verdict>> | Promise<Verdict[]>}
     */
    handleBatch(records: Record[]): Array<Verdict | Promise<Verdict>> | Promise<Verdict[]>;
}
export type PluginObject = {
    init?(config: Config): void | Promise<void>;
    handle?(record: Record): Verdict | Promise<Verdict>;
    handleBatch?(records: Record[]): Verdict[] | Promise<Verdict[]>;
};
export type PluginDefinition = (new () => PluginObject) | PluginObject;
/** A verdict as the component's `handle` export returns it (WIT `verdict`). */
export type WireVerdict = {
    tag: string;
    val?: string | number;
};
/**
 * @typedef {{init?(config: Config): void | Promise<void>, handle?(record: Record): Verdict | Promise<Verdict>,
 *   handleBatch?(records: Record[]): Verdict[] | Promise<Verdict[]>}} PluginObject
 * @typedef {(new () => PluginObject) | PluginObject} PluginDefinition
 *   a class (instantiated with `new`, no arguments, once per component instance) or an object
 *   used as the instance.
 */
/**
 * Drives a plugin the way the host does: `init` with the wire config, then `handle` with
 * wire batches, returning wire verdicts. Used by the component glue and by
 * `testing.run`, so a unit test can exercise the very code path a component runs.
 */
export declare class Runner {
    definition: PluginDefinition;
    /** @type {PluginObject | null} */
    instance: PluginObject | null;
    /** @param {PluginDefinition} definition */
    constructor(definition: PluginDefinition);
    /**
     * Creates the instance and calls its `init`. Returns the refusal message, or `null` (a
     * Promise of either for an `async init`).
     * @param {Iterable<[string, string]>} pairs
     * @param {Iterable<[string, string]>} secrets
     * @returns {string | null | Promise<string | null>}
     */
    init(pairs: Iterable<[string, string]>, secrets: Iterable<[string, string]>): string | null | Promise<string | null>;
    /**
     * Judges one wire batch. Throws (a batch fault) when the plugin throws or returns other
     * than one verdict per record; the error is logged first so it is not lost in a trap.
     * @param {WireBatch} batch
     * @returns {WireVerdict[] | Promise<WireVerdict[]>}
     */
    handle(batch: WireBatch): WireVerdict[] | Promise<WireVerdict[]>;
}

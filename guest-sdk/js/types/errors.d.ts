/**
 * Why the host refused an emit (the contract's `emit-error`). Nothing is dropped silently:
 * a refused emit is not produced, and the plugin decides what that means for its record
 * (usually `release()`, or `reject(err.message)`).
 *
 * `kind` is one of `'no-such-record'`, `'unknown-output'`, `'too-many-emits'`,
 * `'too-many-bytes'`, `'reserved-header'`; `detail` carries the output name, the limit or
 * the header key (undefined for `'no-such-record'`).
 */
export declare class EmitError extends Error {
    /** Which refusal (the WIT `emit-error` case name). */
    kind: "no-such-record" | "reserved-header" | "too-many-bytes" | "too-many-emits" | "unknown-output";
    /** The output name, the manifest limit or the header key, per `kind`. */
    detail: string | number;
    /**
     * @param {'no-such-record' | 'unknown-output' | 'too-many-emits' | 'too-many-bytes' | 'reserved-header'} kind
     * @param {string | number} [detail]
     */
    constructor(kind: 'no-such-record' | 'unknown-output' | 'too-many-emits' | 'too-many-bytes' | 'reserved-header', detail?: string | number);
}

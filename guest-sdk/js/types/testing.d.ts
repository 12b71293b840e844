/**
 * Fakes for unit-testing a plugin under `node --test`, no WebAssembly involved: build
 * records and configurations, collect what the plugin logs and emits, make emits fail, and
 * run a plugin through the same init/handle path a component runs.
 *
 * ```js
 * import { test } from 'node:test';
 * import assert from 'node:assert/strict';
 * import { accept } from '@sharehost/guest';
 * import * as testing from '@sharehost/guest/testing';
 * import SizeLimit from './plugin.js';
 *
 * test('small values pass', () => {
 *   const p = testing.create(SizeLimit, { 'max-bytes': '3' });
 *   assert.deepEqual(p.handle(testing.record({ value: 'abc' })), accept());
 * });
 * ```
 *
 * @module @sharehost/guest/testing
 */
import { Config } from './index.js';
/**
 * Installs a fresh fake host: clears collected logs, emits, fetch requests, any emit policy
 * and any fetch mock, and stops echoing log lines to stderr. Call it at the start of each
 * test that inspects them.
 */
export declare function reset(): void;
/**
 * What `fetch` rejects with inside a component when a request gets no response (refused by
 * the host, unreachable, timed out).
 */
export declare function networkError(): TypeError;
/**
 * Answers the plugin's `fetch` calls with `answer(request)`: a `Response` (or a Promise of
 * one), or a throw (e.g. `networkError()`). Without a mock every `fetch` rejects with
 * `networkError()`, as in a pipeline that grants no host.
 */
export declare function mockFetch(answer: ((request: Request) => Response | Promise<Response>) | null): void;
/** The requests fetched since the last `takeRequests`/`reset`, in order (and clears them). */
export declare function takeRequests(): Request[];
/**
 * The log lines written since the last `takeLogs`/`reset`, and clears them.
 * @returns {Array<{level: string, message: string}>}
 */
export declare function takeLogs(): Array<{
    level: string;
    message: string;
}>;
/**
 * The emits accepted since the last `takeEmits`/`reset` (copies of their bytes), in order,
 * and clears them.
 * @returns {Array<{recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: Array<{key: string, value: Uint8Array | null}>}>}
 */
export declare function takeEmits(): Array<{
    recordIndex: number;
    output: string;
    key: Uint8Array | null;
    value: Uint8Array | null;
    headers: Array<{
        key: string;
        value: Uint8Array | null;
    }>;
}>;
/**
 * Makes the fake host refuse emits like the real one would: `policy(emit)` returns an
 * `EmitError` (e.g. `new EmitError('too-many-emits', 10)`) to refuse, or nothing to accept.
 * @param {(emit: {recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: Array<{key: string, value: Uint8Array | null}>}) => Error | null | undefined} policy
 */
export declare function refuseEmits(policy: (emit: {
    recordIndex: number;
    output: string;
    key: Uint8Array | null;
    value: Uint8Array | null;
    headers: Array<{
        key: string;
        value: Uint8Array | null;
    }>;
}) => Error | null | undefined): void;
/**
 * A configuration, as `init` receives it.
 * @param {Iterable<[string, string]> | {[key: string]: string}} [pairs]
 * @param {Iterable<[string, string]> | {[key: string]: string}} [secrets]
 */
export declare function config(pairs?: Iterable<[string, string]> | {
    [key: string]: string;
}, secrets?: Iterable<[string, string]> | {
    [key: string]: string;
}): Config;
/**
 * Instantiates a plugin (a class or an object) and calls its `init` with this
 * configuration, as the host does; throws what `init` throws.
 * @template P
 * @param {(new () => P) | P} definition
 * @param {Iterable<[string, string]> | {[key: string]: string}} [pairs]
 * @param {Iterable<[string, string]> | {[key: string]: string}} [secrets]
 * @returns {P}
 */
export declare function create<P>(definition: (new () => P) | P, pairs?: Iterable<[string, string]> | {
    [key: string]: string;
}, secrets?: Iterable<[string, string]> | {
    [key: string]: string;
}): P;
export type RecordSpec = {
    key?: Uint8Array | string | null;
    value?: Uint8Array | string | null;
    headers?: Array<[string, Uint8Array | string | null]> | Array<{
        key: string;
        value: Uint8Array | string | null;
    }> | {
        [key: string]: Uint8Array | string | null;
    };
    /**
     * default `test`
     */
    topic?: string;
    /**
     * default 0
     */
    partition?: number;
    /**
     * default: the record's index in its batch
     */
    offset?: number | bigint;
    /**
     * default 0
     */
    timestamp?: number | bigint;
    /**
     * default 1
     */
    deliveryCount?: number;
};
/**
 * The contract's columnar batch (what a component's `handle` receives) for these records.
 * Why: tests then decode records exactly as a component does, spans and nulls included.
 * @param {RecordSpec[]} specs
 * @returns {import('./index.js').WireBatch}
 */
export declare function batch(specs: RecordSpec[]): import('./index.js').WireBatch;
/**
 * Records of one test batch (indexes 0..n-1, offsets default to the index).
 * @param {RecordSpec[]} specs
 * @returns {import('./index.js').Record[]}
 */
export declare function records(specs: RecordSpec[]): import('./index.js').Record[];
/**
 * One test record (index 0, offset 0 unless given, topic `test`, first delivery).
 * @param {RecordSpec} [spec]
 * @returns {import('./index.js').Record}
 */
export declare function record(spec?: RecordSpec): import('./index.js').Record;
/**
 * Runs a plugin the way the host does — fresh instance, `init`, then `handle` per batch —
 * through the SDK's component code path, and returns the verdicts per batch in the
 * contract's wire shape (`{tag: 'reject', val: 'reason'}`), or throws what `init` refused
 * with. Why: catches mistakes a direct `handle` call hides (wrong verdict count, a returned
 * non-verdict, a refusal message).
 * @param {import('./index.js').PluginDefinition} definition
 * @param {RecordSpec[][]} batches
 * @param {{config?: Iterable<[string, string]> | {[key: string]: string}, secrets?: Iterable<[string, string]> | {[key: string]: string}}} [options]
 * @returns {Array<Array<{tag: string, val?: string | number}>> | Promise<Array<Array<{tag: string, val?: string | number}>>>}
 *   a Promise when the plugin is async.
 */
export declare function run(definition: import('./index.js').PluginDefinition, batches: RecordSpec[][], options?: {
    config?: Iterable<[string, string]> | {
        [key: string]: string;
    };
    secrets?: Iterable<[string, string]> | {
        [key: string]: string;
    };
}): Array<Array<import('./index.js').WireVerdict>> | Promise<Array<Array<import('./index.js').WireVerdict>>>;

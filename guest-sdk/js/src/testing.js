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

import { FakeHost, setBackend, getBackend } from './host.js';
import { Config, Runner, recordsOf } from './index.js';

const encoder = new TextEncoder();
const NULL_START = 0xffffffff;

/** @returns {FakeHost} the fake host, installing a fresh one if another backend is active. */
function fake() {
  const b = getBackend();
  if (b instanceof FakeHost) return b;
  const f = new FakeHost();
  setBackend(f);
  return f;
}

/**
 * Installs a fresh fake host: clears collected logs, emits, fetch requests, any emit policy
 * and any fetch mock, and stops echoing log lines to stderr. Call it at the start of each
 * test that inspects them.
 */
export function reset() {
  setBackend(new FakeHost({ echo: false }));
  fetchMock = null;
  requests = [];
}

// ---------------------------------------------------------------------------------------
// fetch

/**
 * What `fetch` rejects with inside a component when a request gets no response: the host
 * refused it (not in the pipeline's `allowed_outbound_hosts`), the server could not be
 * reached, or the host's timeout passed. The engine does not say which; the host logs it.
 * @returns {TypeError}
 */
export function networkError() {
  return new TypeError('NetworkError when attempting to fetch resource');
}

/** @type {((request: Request) => Response | Promise<Response>) | null} */
let fetchMock = null;
/** @type {Request[]} */
let requests = [];

/**
 * Answers the plugin's `fetch` calls with `answer(request)` (a standard `Request`): return a
 * `Response` (or a Promise of one), or throw, e.g. `networkError()`. Without a mock every
 * `fetch` rejects with `networkError()`, as in a pipeline that grants no host. Why a fake
 * global: a plugin calls the standard `fetch` in a component, so its tests replace that.
 * @param {((request: Request) => Response | Promise<Response>) | null} answer
 */
export function mockFetch(answer) {
  fetchMock = answer;
}

/**
 * The requests the plugin fetched since the last `takeRequests`/`reset`, in order (and
 * clears them): standard `Request` objects (`url`, `method`, `headers.get(name)`, `text()`).
 * @returns {Request[]}
 */
export function takeRequests() {
  const out = requests;
  requests = [];
  return out;
}

/** The global `fetch` under test: the mock, never the network. */
async function fakeFetch(input, init) {
  const request = new Request(input, init);
  requests.push(request.clone());
  if (fetchMock === null) throw networkError();
  const response = await fetchMock(request);
  if (!(response instanceof Response)) {
    throw new TypeError(`the fetch mock answered ${typeof response}: return a Response or throw`);
  }
  return response;
}

globalThis.fetch = fakeFetch;

/**
 * The log lines written since the last `takeLogs`/`reset`, and clears them.
 * @returns {Array<{level: string, message: string}>}
 */
export function takeLogs() {
  const f = fake();
  const out = f.logs;
  f.logs = [];
  return out;
}

/**
 * The emits accepted since the last `takeEmits`/`reset` (copies of their bytes), in order,
 * and clears them.
 * @returns {Array<{recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: Array<{key: string, value: Uint8Array | null}>}>}
 */
export function takeEmits() {
  const f = fake();
  const out = f.emits;
  f.emits = [];
  return out;
}

/**
 * Makes the fake host refuse emits like the real one would: `policy(emit)` returns an
 * `EmitError` (e.g. `new EmitError('too-many-emits', 10)`) to refuse, or nothing to accept.
 * @param {(emit: {recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: Array<{key: string, value: Uint8Array | null}>}) => Error | null | undefined} policy
 */
export function refuseEmits(policy) {
  fake().policy = policy;
}

/**
 * A configuration, as `init` receives it.
 * @param {Iterable<[string, string]> | {[key: string]: string}} [pairs]
 * @param {Iterable<[string, string]> | {[key: string]: string}} [secrets]
 */
export function config(pairs = [], secrets = []) {
  return new Config(pairs, secrets);
}

/**
 * Instantiates a plugin (a class or an object) and calls its `init` with this
 * configuration, as the host does; throws what `init` throws.
 * @template P
 * @param {(new () => P) | P} definition
 * @param {Iterable<[string, string]> | {[key: string]: string}} [pairs]
 * @param {Iterable<[string, string]> | {[key: string]: string}} [secrets]
 * @returns {P}
 */
export function create(definition, pairs = [], secrets = []) {
  const p = typeof definition === 'function' ? new /** @type {any} */ (definition)() : definition;
  if (typeof p.init === 'function') p.init(new Config(pairs, secrets));
  return p;
}

/**
 * What a test record may say; everything is optional. Bytes are `Uint8Array` or text
 * (encoded as UTF-8); `null` is a null key/value (the default key is null, the default value
 * empty). `headers`: `{key: value}` or `[[key, value]]` / `[{key, value}]`.
 * @typedef {object} RecordSpec
 * @property {Uint8Array | string | null} [key]
 * @property {Uint8Array | string | null} [value]
 * @property {Array<[string, Uint8Array | string | null]> | Array<{key: string, value: Uint8Array | string | null}> | {[key: string]: Uint8Array | string | null}} [headers]
 * @property {string} [topic] default `test`
 * @property {number} [partition] default 0
 * @property {number | bigint} [offset] default: the record's index in its batch
 * @property {number | bigint} [timestamp] default 0
 * @property {number} [deliveryCount] default 1
 */

function bytes(v) {
  if (v === null) return null;
  if (typeof v === 'string') return encoder.encode(v);
  if (v instanceof Uint8Array) return v;
  throw new TypeError(`test record bytes: Uint8Array, text or null, got ${typeof v}`);
}

/**
 * The contract's columnar batch (what a component's `handle` receives) for these records.
 * Why: tests then decode records exactly as a component does, spans and nulls included.
 * @param {RecordSpec[]} specs
 * @returns {import('./index.js').WireBatch}
 */
export function batch(specs) {
  const topics = [];
  const topicIndex = [];
  const chunks = [];
  let size = 0;
  const keySpans = [];
  const valueSpans = [];
  const headerRanges = [];
  const headerSpans = [];
  const put = (b, out) => {
    if (b === null) {
      out.push(NULL_START, 0);
      return;
    }
    out.push(size, b.length);
    chunks.push(b);
    size += b.length;
  };
  let headerCount = 0;
  specs.forEach((s, i) => {
    const topic = s.topic ?? 'test';
    let t = topics.indexOf(topic);
    if (t < 0) t = topics.push(topic) - 1;
    topicIndex.push(t);
    put(s.key === undefined ? null : bytes(s.key), keySpans);
    put(s.value === undefined ? new Uint8Array(0) : bytes(s.value), valueSpans);
    const hs = s.headers ?? [];
    const list = Array.isArray(hs) ? hs.map((h) => (Array.isArray(h) ? h : [h.key, h.value])) : Object.entries(hs);
    headerRanges.push(headerCount, list.length);
    for (const [k, v] of list) {
      put(encoder.encode(k), headerSpans);
      put(bytes(v), headerSpans);
      headerCount++;
    }
  });
  const data = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    data.set(c, at);
    at += c.length;
  }
  return {
    topics,
    topicIndex: Uint32Array.from(topicIndex),
    partitions: Int32Array.from(specs.map((s) => s.partition ?? 0)),
    offsets: BigInt64Array.from(specs.map((s, i) => BigInt(s.offset ?? i))),
    timestamps: BigInt64Array.from(specs.map((s) => BigInt(s.timestamp ?? 0))),
    deliveryCounts: Uint16Array.from(specs.map((s) => s.deliveryCount ?? 1)),
    keySpans: Uint32Array.from(keySpans),
    valueSpans: Uint32Array.from(valueSpans),
    headerRanges: Uint32Array.from(headerRanges),
    headerSpans: Uint32Array.from(headerSpans),
    data,
  };
}

/**
 * Records of one test batch (indexes 0..n-1, offsets default to the index).
 * @param {RecordSpec[]} specs
 * @returns {import('./index.js').Record[]}
 */
export function records(specs) {
  return recordsOf(batch(specs));
}

/**
 * One test record (index 0, offset 0 unless given, topic `test`, first delivery).
 * @param {RecordSpec} [spec]
 * @returns {import('./index.js').Record}
 */
export function record(spec = {}) {
  return records([spec])[0];
}

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
export function run(definition, batches, options = {}) {
  const runner = new Runner(definition);
  const out = [];
  // Batch after batch, as the host calls them; an async plugin makes it a Promise.
  const from = (i) => {
    for (; i < batches.length; i++) {
      const verdicts = runner.handle(batch(batches[i]));
      if (verdicts instanceof Promise) {
        const next = i + 1;
        return verdicts.then((v) => {
          out.push(v);
          return from(next);
        });
      }
      out.push(verdicts);
    }
    return out;
  };
  const start = (refused) => {
    if (refused !== null) throw new Error(`init refused the configuration: ${refused}`);
    return from(0);
  };
  const refused = runner.init(toPairs(options.config), toPairs(options.secrets));
  return refused instanceof Promise ? refused.then(start) : start(refused);
}

function toPairs(p) {
  if (p === undefined) return [];
  return Symbol.iterator in Object(p) ? [...p] : Object.entries(p);
}

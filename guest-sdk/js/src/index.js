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

import { getBackend } from './host.js';
import { EmitError } from './errors.js';
import { mapStack } from './stack.js';

export { EmitError } from './errors.js';
export { RESERVED_HEADER_PREFIX } from './host.js';

// ---------------------------------------------------------------------------------------
// Verdicts

/**
 * What should happen to one record. Build one with `accept()`, `release()`,
 * `reject(reason)`, `renew()` or `retry(afterMs)`; compare with `assert.deepEqual`.
 *
 * @typedef {{kind: 'accept'} | {kind: 'release'} | {kind: 'renew'}
 *   | {kind: 'reject', reason: string | null} | {kind: 'retry', afterMs: number}} Verdict
 */

const ACCEPT = Object.freeze({ kind: 'accept' });
const RELEASE = Object.freeze({ kind: 'release' });
const RENEW = Object.freeze({ kind: 'renew' });
const U32_MAX = 0xffffffff;

/**
 * Processed: acknowledge the record; it is never delivered again.
 * @returns {Verdict}
 */
export function accept() {
  return ACCEPT;
}

/**
 * Not processed now: hand the record back for redelivery (to any consumer of the group).
 * @returns {Verdict}
 */
export function release() {
  return RELEASE;
}

/**
 * Still working on it: keep the acquisition lock (KIP-932 renew) and deliver the record
 * here again later.
 * @returns {Verdict}
 */
export function renew() {
  return RENEW;
}

/**
 * Unprocessable: never deliver the record again (dead-lettered when the pipeline has a
 * dead-letter topic). The reason is logged and travels with the dead letter; the host
 * bounds its length.
 * @param {string | null} [reason]
 * @returns {{kind: 'reject', reason: string | null}}
 */
export function reject(reason) {
  if (reason === undefined || reason === null) return Object.freeze({ kind: 'reject', reason: null });
  return Object.freeze({ kind: 'reject', reason: String(reason) });
}

/**
 * Not now, try again after `afterMs` milliseconds: the host keeps the record acquired and
 * releases it for redelivery when the delay has passed, so a plugin facing a 429 or a down
 * dependency backs off instead of spinning through deliveries. The host caps the delay
 * (`max_retry_delay_ms`); the record's emits are discarded. Fractions are rounded down,
 * delays past 2^32-1 ms (about 49 days) saturate; a negative or non-numeric delay throws.
 * @param {number} afterMs
 * @returns {{kind: 'retry', afterMs: number}}
 */
export function retry(afterMs) {
  if (typeof afterMs !== 'number' || Number.isNaN(afterMs) || afterMs < 0) {
    throw new RangeError(`retry(afterMs): a non-negative number of milliseconds, got ${afterMs}`);
  }
  return Object.freeze({ kind: 'retry', afterMs: Math.min(Math.floor(afterMs), U32_MAX) });
}

// Shared wire verdicts: the bindings only read them, and a batch of accepts then allocates
// nothing per record.
const WIRE_ACCEPT = Object.freeze({ tag: 'accept' });
const WIRE_RELEASE = Object.freeze({ tag: 'release' });
const WIRE_RENEW = Object.freeze({ tag: 'renew' });

/** The verdict in the shape the component's `handle` export returns (WIT `verdict`). */
function toWire(v, i, offset) {
  switch (v?.kind) {
    case 'accept':
      return WIRE_ACCEPT;
    case 'release':
      return WIRE_RELEASE;
    case 'renew':
      return WIRE_RENEW;
    case 'reject':
      return v.reason === null || v.reason === undefined
        ? { tag: 'reject', val: undefined }
        : { tag: 'reject', val: String(v.reason) };
    case 'retry':
      return { tag: 'retry', val: retry(v.afterMs).afterMs };
    default:
      throw new TypeError(
        `record ${i} (offset ${offset}): the plugin returned ${describe(v)}, not a verdict; ` +
          'return accept(), release(), reject(reason), renew() or retry(ms)',
      );
  }
}

function isThenable(v) {
  return v !== null && typeof v === 'object' && typeof v.then === 'function';
}

function describe(v) {
  if (isThenable(v)) return 'a Promise';
  if (typeof v === 'function') return `the function ${v.name || '(anonymous)'} (missing "()"?)`;
  if (typeof v === 'string') return JSON.stringify(v);
  try {
    return `${typeof v} ${JSON.stringify(v)}`;
  } catch {
    return typeof v;
  }
}

// ---------------------------------------------------------------------------------------
// Config

/**
 * The pipeline's configuration: the manifest's key/value pairs, in order, and apart from
 * them its secrets (`[pipeline.secrets]`). Secrets are kept out of `get`, `entries` and
 * `JSON.stringify`/`console.log` so that code dumping the configuration never dumps them.
 */
export class Config {
  #pairs;
  #secrets;

  /**
   * @param {Iterable<[string, string]> | {[key: string]: string}} [pairs]
   * @param {Iterable<[string, string]> | {[key: string]: string}} [secrets]
   */
  constructor(pairs = [], secrets = []) {
    this.#pairs = toPairs(pairs);
    this.#secrets = toPairs(secrets);
  }

  /**
   * The value of the last pair named `key` (later entries override earlier ones), or
   * `fallback` (default `undefined`) when there is none.
   * @template [T=undefined]
   * @param {string} key
   * @param {T} [fallback]
   * @returns {string | T}
   */
  get(key, fallback) {
    for (let i = this.#pairs.length - 1; i >= 0; i--) {
      if (this.#pairs[i][0] === key) return this.#pairs[i][1];
    }
    return /** @type {T} */ (fallback);
  }

  /**
   * Whether a pair named `key` exists.
   * @param {string} key
   */
  has(key) {
    return this.#pairs.some(([k]) => k === key);
  }

  /**
   * The secret named `name` (from `[pipeline.secrets]`), e.g. an API token, or `undefined`.
   * Keep it out of logs, reasons and emits yourself.
   * @param {string} name
   * @returns {string | undefined}
   */
  secret(name) {
    for (let i = this.#secrets.length - 1; i >= 0; i--) {
      if (this.#secrets[i][0] === name) return this.#secrets[i][1];
    }
    return undefined;
  }

  /**
   * All pairs, in order (secrets not included).
   * @returns {Array<[string, string]>}
   */
  entries() {
    return this.#pairs.map(([k, v]) => [k, v]);
  }

  /** Pairs plus the secrets' names only, so logging a Config never leaks a secret. */
  toJSON() {
    return { pairs: this.entries(), secrets: this.#secrets.map(([k]) => k) };
  }

  /** Same redacted view for `util.inspect` / `console.log` under node. */
  [Symbol.for('nodejs.util.inspect.custom')]() {
    return `Config ${JSON.stringify(this.toJSON())}`;
  }
}

function toPairs(p) {
  const it = p !== null && typeof p === 'object' && !(Symbol.iterator in p) ? Object.entries(p) : p;
  return Array.from(it, ([k, v]) => [String(k), String(v)]);
}

// ---------------------------------------------------------------------------------------
// Log

/**
 * Formats `console.log`-style arguments as one line: strings as they are, errors with their
 * stack, other values as JSON (BigInt and byte arrays included). Why: the host's log takes
 * one string per line.
 * @param {unknown[]} args
 * @returns {string}
 */
export function format(...args) {
  return args.map(formatOne).join(' ');
}

function formatOne(a) {
  if (typeof a === 'string') return a;
  if (a instanceof Error) {
    // In a component the stack points into the bundle: read it as the plugin's own lines.
    const stack = a.stack ? mapStack(a.stack) : '';
    return stack.includes(a.message) ? stack : `${a.name}: ${a.message}${stack ? `\n${stack}` : ''}`;
  }
  if (typeof a === 'bigint') return `${a}n`;
  if (a === undefined || typeof a === 'function' || typeof a === 'symbol') return String(a);
  try {
    return JSON.stringify(a, (_k, v) => {
      if (typeof v === 'bigint') return `${v}n`;
      if (v instanceof Uint8Array) return `Uint8Array(${v.length})`;
      return v;
    }) ?? String(a);
  } catch {
    return String(a);
  }
}

/**
 * Logging to the host's log, tagged with the plugin's name. Each call writes one line
 * (arguments formatted like `console.log`). The host bounds it: a message over 4 KiB is
 * truncated, a batch may log at most 256 messages; the rest are dropped and counted.
 * Inside a component `console.log/info` go to `info`, `console.debug` to `debug`,
 * `console.warn` to `warn`, `console.error` to `error`, `console.trace` to `trace`.
 * Natively (tests) lines go to the `testing` fake host (and to stderr unless a test reset it).
 */
export const log = Object.freeze({
  /** Very detailed tracing. */
  trace: (...args) => getBackend().log('trace', format(...args)),
  /** Debugging detail. */
  debug: (...args) => getBackend().log('debug', format(...args)),
  /** Normal operation. */
  info: (...args) => getBackend().log('info', format(...args)),
  /** Something unusual the operator may want to know. */
  warn: (...args) => getBackend().log('warn', format(...args)),
  /** Something failed. */
  error: (...args) => getBackend().log('error', format(...args)),
});

// ---------------------------------------------------------------------------------------
// Records

const NULL_START = 0xffffffff;
const encoder = new TextEncoder();
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * UTF-8 text of bytes, or `null` for `null` or invalid UTF-8 (like the Rust SDK's
 * `value_str`). A leading BOM is kept, not stripped.
 * @param {Uint8Array | null} bytes
 * @returns {string | null}
 */
export function text(bytes) {
  if (bytes === null) return null;
  try {
    return utf8.decode(bytes);
  } catch {
    return null;
  }
}

/**
 * The contract's columnar batch (WIT `batch`), as the component receives it.
 * @typedef {object} WireBatch
 * @property {string[]} topics
 * @property {ArrayLike<number>} topicIndex
 * @property {ArrayLike<number>} partitions
 * @property {ArrayLike<bigint>} offsets
 * @property {ArrayLike<bigint>} timestamps
 * @property {ArrayLike<number>} deliveryCounts
 * @property {ArrayLike<number>} keySpans
 * @property {ArrayLike<number>} valueSpans
 * @property {ArrayLike<number>} headerRanges
 * @property {ArrayLike<number>} headerSpans
 * @property {Uint8Array} data
 */

/**
 * One header of a record.
 * @typedef {{key: string, value: Uint8Array | null}} Header
 */

function span(data, spans, i) {
  const start = spans[2 * i];
  if (start === undefined || start === NULL_START) return null;
  const len = spans[2 * i + 1] ?? 0;
  return data.subarray(start, start + len);
}

/**
 * One record of a batch. `key`, `value` and `headers` are decoded from the batch only when
 * read, as `Uint8Array` views into the batch buffer (`null` is a null key/value, distinct
 * from an empty one). Views pin the whole batch buffer: to keep bytes past this batch,
 * copy them (`record.value.slice()`).
 *
 * `offset` and `timestamp` are plain numbers, exact up to 2^53 (9,007,199,254,740,992);
 * `offsetBigInt` and `timestampBigInt` are always exact.
 */
export class Record {
  #b;
  #i;
  #key;
  #value;
  #headers;

  /**
   * Records are made by the SDK from a batch (and by `testing.record` in tests).
   * @param {WireBatch} batch
   * @param {number} index
   */
  constructor(batch, index) {
    this.#b = batch;
    this.#i = index;
  }

  /** The record's position in its batch (0-based): what binds an emit to this record. */
  get index() {
    return this.#i;
  }

  /** The topic the record was fetched from. */
  get topic() {
    return this.#b.topics[this.#b.topicIndex[this.#i]] ?? '';
  }

  /** The partition the record was fetched from. */
  get partition() {
    return this.#b.partitions[this.#i] ?? 0;
  }

  /** The record's offset in its partition (a number: exact up to 2^53; see `offsetBigInt`). */
  get offset() {
    return Number(this.offsetBigInt);
  }

  /** The record's offset, exact. */
  get offsetBigInt() {
    return BigInt(this.#b.offsets[this.#i] ?? 0n);
  }

  /** Record timestamp, milliseconds since the Unix epoch (a number; `new Date(record.timestamp)`). */
  get timestamp() {
    return Number(this.timestampBigInt);
  }

  /** Record timestamp, exact. */
  get timestampBigInt() {
    return BigInt(this.#b.timestamps[this.#i] ?? 0n);
  }

  /** How many times the broker has delivered this record, including now (1 = first time). */
  get deliveryCount() {
    return this.#b.deliveryCounts[this.#i] ?? 1;
  }

  /**
   * A name for this record that is the same at every delivery, `TOPIC/PARTITION/OFFSET`: hand it
   * to a service the plugin calls (an `Idempotency-Key` header) so that a call made again after
   * a redelivery does its work once. The host cannot undo a call outside Kafka, even in an
   * exactly-once pipeline; the service can, with this key.
   * @returns {string}
   */
  get idempotencyKey() {
    return `${this.topic}/${this.partition}/${this.offsetBigInt}`;
  }

  /**
   * The key bytes, or `null` for a null key.
   * @returns {Uint8Array | null}
   */
  get key() {
    if (this.#key === undefined) this.#key = span(this.#b.data, this.#b.keySpans, this.#i);
    return this.#key;
  }

  /**
   * The value bytes, or `null` for a null value (a tombstone).
   * @returns {Uint8Array | null}
   */
  get value() {
    if (this.#value === undefined) this.#value = span(this.#b.data, this.#b.valueSpans, this.#i);
    return this.#value;
  }

  /**
   * Headers in order (keys may repeat).
   * @returns {ReadonlyArray<Header>}
   */
  get headers() {
    if (this.#headers === undefined) {
      const b = this.#b;
      const first = b.headerRanges[2 * this.#i] ?? 0;
      const count = b.headerRanges[2 * this.#i + 1] ?? 0;
      const out = [];
      for (let h = first; h < first + count; h++) {
        out.push(Object.freeze({ key: text(span(b.data, b.headerSpans, 2 * h)) ?? '', value: span(b.data, b.headerSpans, 2 * h + 1) }));
      }
      this.#headers = Object.freeze(out);
    }
    return this.#headers;
  }

  /**
   * The key as UTF-8 text; `null` when null or not valid UTF-8.
   * @returns {string | null}
   */
  keyText() {
    return text(this.key);
  }

  /**
   * The value as UTF-8 text; `null` when null (a tombstone) or not valid UTF-8.
   * @returns {string | null}
   */
  valueText() {
    return text(this.value);
  }

  /**
   * The value of the first header named `name`: `undefined` when absent, `null` when present
   * with a null value.
   * @param {string} name
   * @returns {Uint8Array | null | undefined}
   */
  header(name) {
    return this.headers.find((h) => h.key === name)?.value;
  }

  /**
   * The first header named `name` as UTF-8 text: `undefined` when absent, `null` when null
   * or not valid UTF-8.
   * @param {string} name
   * @returns {string | null | undefined}
   */
  headerText(name) {
    const v = this.header(name);
    return v === undefined ? undefined : text(v);
  }

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
  emit(output, message = {}) {
    if (typeof output !== 'string') throw new TypeError('emit(output, ...): output must be a string (an output name from the manifest)');
    const headers = normalizeHeaders(message.headers ?? []);
    getBackend().emit(this.#i, output, toBytes(message.key), toBytes(message.value), headers);
  }

  /** A plain summary for logs and test failures (bytes shown as text when UTF-8). */
  toJSON() {
    return {
      index: this.index,
      topic: this.topic,
      partition: this.partition,
      offset: this.offset,
      timestamp: this.timestamp,
      deliveryCount: this.deliveryCount,
      key: this.keyText() ?? this.key,
      value: this.valueText() ?? this.value,
      headers: this.headers.map((h) => ({ key: h.key, value: text(h.value) ?? h.value })),
    };
  }

  /** Same summary for `util.inspect` / `console.log` under node. */
  [Symbol.for('nodejs.util.inspect.custom')]() {
    return `Record ${JSON.stringify(this.toJSON())}`;
  }
}

function toBytes(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === 'string') return encoder.encode(v);
  if (v instanceof Uint8Array) return v;
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  throw new TypeError(`expected bytes (Uint8Array), text or null, got ${typeof v}`);
}

function normalizeHeaders(h) {
  const list = Array.isArray(h) ? h : Object.entries(h);
  return list.map((e) => {
    const [key, value] = Array.isArray(e) ? e : [e.key, e.value];
    if (typeof key !== 'string') throw new TypeError('emit: a header key must be a string');
    return { key, value: toBytes(value) };
  });
}

/**
 * Records of a wire batch (one `Record` per entry of `offsets`), decoded lazily.
 * @param {WireBatch} batch
 * @returns {Record[]}
 */
export function recordsOf(batch) {
  const n = batch.offsets.length;
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = new Record(batch, i);
  return out;
}

/** One wire verdict per record, or a TypeError saying what the plugin returned instead. */
function toWireAll(verdicts, records) {
  if (!Array.isArray(verdicts) || verdicts.length !== records.length) {
    throw new TypeError(
      `handleBatch returned ${Array.isArray(verdicts) ? `${verdicts.length} verdicts` : describe(verdicts)} for ${records.length} records; return one verdict per record, in order`,
    );
  }
  return verdicts.map((v, i) => toWire(v, i, records[i].offset));
}

// ---------------------------------------------------------------------------------------
// Plugin

/**
 * A base class for plugins (optional: any class or object with `handle` or `handleBatch`
 * works). The host calls `init(config)` once per fresh instance, then `handleBatch` per
 * batch; the default `handleBatch` calls `handle(record)` for each record.
 *
 * Fields of `this` live across the batches of one instance (caches, counters); instances
 * are recycled (after N batches and after any fault), so nothing there must need to survive.
 */
export class Plugin {
  /**
   * Reads the pipeline configuration. Throw to refuse it: the error's message reaches the
   * host as init's error, and at load the pipeline does not start and shows it (never put a
   * secret in it).
   * @param {Config} _config
   */
  init(_config) {}

  /**
   * Judges one record (may be `async`: the requests of a batch then run at the same time).
   * @param {Record} _record
   * @returns {Verdict | Promise<Verdict>}
   */
  handle(_record) {
    throw new Error(`${this.constructor.name}: implement handle(record) or handleBatch(records)`);
  }

  /**
   * Judges a batch: exactly one verdict per record, in order. Override it to work on the
   * batch as a whole (`async handleBatch` with `await Promise.all(...)` for requests).
   * @param {Record[]} records
   * @returns {Array<Verdict | Promise<Verdict>> | Promise<Verdict[]>}
   */
  handleBatch(records) {
    return records.map((r) => this.handle(r));
  }
}

/**
 * @typedef {{init?(config: Config): void | Promise<void>, handle?(record: Record): Verdict | Promise<Verdict>,
 *   handleBatch?(records: Record[]): Verdict[] | Promise<Verdict[]>}} PluginObject
 * @typedef {(new () => PluginObject) | PluginObject} PluginDefinition
 *   a class (instantiated with `new`, no arguments, once per component instance) or an object
 *   used as the instance.
 * @typedef {{tag: string, val?: string | number}} WireVerdict
 *   a verdict as the component's `handle` export returns it (WIT `verdict`).
 */

/**
 * Drives a plugin the way the host does: `init` with the wire config, then `handle` with
 * wire batches, returning wire verdicts. Used by the component glue and by
 * `testing.run`, so a unit test can exercise the very code path a component runs.
 */
export class Runner {
  /** @param {PluginDefinition} definition */
  constructor(definition) {
    if (typeof definition !== 'function' && (definition === null || typeof definition !== 'object')) {
      throw new TypeError('a plugin module must `export default` a class or an object with handle(record) or handleBatch(records)');
    }
    this.definition = definition;
    /** @type {PluginObject | null} */
    this.instance = null;
  }

  /**
   * Creates the instance and calls its `init`. Returns the refusal message, or `null` (a
   * Promise of either for an `async init`).
   * @param {Iterable<[string, string]>} pairs
   * @param {Iterable<[string, string]>} secrets
   * @returns {string | null | Promise<string | null>}
   */
  init(pairs, secrets) {
    this.instance = null;
    const refusal = (e) => (e instanceof Error ? e.message : String(e));
    try {
      const d = this.definition;
      const p = typeof d === 'function' ? new d() : d;
      if (typeof p.handle !== 'function' && typeof p.handleBatch !== 'function') {
        throw new TypeError('the plugin has neither handle(record) nor handleBatch(records)');
      }
      const done = typeof p.init === 'function' ? p.init(new Config(pairs, secrets)) : undefined;
      if (isThenable(done)) {
        // An `async init` (e.g. one that fetches a setting): the component runs the event loop
        // until it settles.
        return Promise.resolve(done).then(
          () => {
            this.instance = p;
            return null;
          },
          refusal,
        );
      }
      this.instance = p;
      return null;
    } catch (e) {
      return refusal(e);
    }
  }

  /**
   * Judges one wire batch. Throws (a batch fault) when the plugin throws or returns other
   * than one verdict per record; the error is logged first so it is not lost in a trap. An
   * async plugin's verdicts come as a Promise (that rejects instead of throwing).
   * @param {WireBatch} batch
   * @returns {WireVerdict[] | Promise<WireVerdict[]>}
   */
  handle(batch) {
    const records = recordsOf(batch);
    const p = this.instance;
    if (p === null) return records.map(() => WIRE_RELEASE);
    const fail = (e) => {
      getBackend().log('error', `plugin threw while judging a batch of ${records.length}: ${formatOne(e)}`);
      throw e;
    };
    try {
      const verdicts = typeof p.handleBatch === 'function'
        ? p.handleBatch(records)
        : records.map((r) => p.handle(r));
      // An `async` plugin (one that awaits fetch, say): a Promise of the verdicts, or verdicts
      // that are Promises. The component runs the event loop until they settle, so the
      // requests of a batch run at the same time (`Promise.all`).
      if (isThenable(verdicts)) {
        return Promise.resolve(verdicts).then((v) => toWireAll(v, records)).catch(fail);
      }
      if (Array.isArray(verdicts) && verdicts.some(isThenable)) {
        return Promise.all(verdicts).then((v) => toWireAll(v, records)).catch(fail);
      }
      return toWireAll(verdicts, records);
    } catch (e) {
      return fail(e);
    }
  }
}

/**
 * Prices JSON orders over HTTP and emits the enriched order to the `enriched` output: the
 * JavaScript twin of examples/enricher (Rust). The same input and the same pricing service give
 * the same verdicts, reasons and emitted bytes.
 *
 * For a batch, every distinct SKU is asked once, all at the same time (`fetch` under
 * `Promise.all`): `GET {pricing-url}/price/{sku}`, with `Authorization: Bearer TOKEN` when the
 * pipeline has the secret `api-token`. The service answers `{"unit_price": X}`.
 *
 * - an order (a JSON object with a non-empty string `sku` and a positive integer `quantity`)
 *   whose lookup answers 2xx with a numeric `unit_price`: emit `{..order, "unit_price": X,
 *   "total": X × quantity}` (keys sorted, numbers as serde_json writes them) to `enriched`,
 *   accept;
 * - 404: reject ``unknown sku `Z-9` ``;
 * - 429, 5xx, any other status, an unreadable price, or no answer: retry after
 *   `retry-after-ms` (or the 429/503's `Retry-After`, if longer);
 * - anything else: reject with what is wrong (no lookup).
 *
 * An emit the host refuses for the batch's budget releases the order instead of accepting it.
 *
 * Configuration: `pricing-url` (required), `retry-after-ms` (default 2000), `output` (default
 * `enriched`). Secret: `api-token` (optional).
 */

import { EmitError, Plugin, accept, log, reject, release, retry } from '@sharehost/guest';
// The order validator's reader: JSON exactly as serde_json (the Rust twin's parser) reads it,
// with each number's literal kept, so integers and doubles stay apart as they do in Rust.
import { JsonNumber, parse } from '../order-validator/json.js';

const U32_MAX = 0xffffffffn;
const U64_MAX = 18446744073709551615n;
const I64_MIN = -9223372036854775808n;
const WHOLE = /^\+?[0-9]+$/;
const encoder = new TextEncoder();

/**
 * A double as serde_json 1.0.154 writes it: the shortest digits that read back (like
 * `String(x)`), always with a fraction or an exponent, in exponent form below 1e-5 and from
 * 1e16 on (`7.0`, `0.3`, `0.00001`, `1e+16`, `1.5e-7`).
 * @param {number} x
 */
export function ryu(x) {
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const sign = x < 0 ? '-' : '';
  const [mantissa, exp = '0'] = String(Math.abs(x)).split('e');
  const [whole, frac = ''] = mantissa.split('.');
  let digits = (whole + frac).replace(/^0+/, '');
  let k = Number(exp) - frac.length;
  const stripped = digits.replace(/0+$/, '');
  k += digits.length - stripped.length;
  digits = stripped;
  const n = digits.length;
  const kk = n + k;
  let text;
  if (k >= 0 && kk <= 16) text = `${digits}${'0'.repeat(k)}.0`;
  else if (kk > 0 && kk <= 16) text = `${digits.slice(0, kk)}.${digits.slice(kk)}`;
  else if (kk > -5 && kk <= 0) text = `0.${'0'.repeat(-kk)}${digits}`;
  else if (n === 1) text = `${digits}e${kk > 1 ? '+' : ''}${kk - 1}`;
  else text = `${digits[0]}.${digits.slice(1)}e${kk > 1 ? '+' : ''}${kk - 1}`;
  return sign + text;
}

/** Compares strings by code point, as serde_json's map (a BTreeMap of UTF-8 keys) orders them. */
function byCodePoint(a, b) {
  const x = encoder.encode(a);
  const y = encoder.encode(b);
  const n = Math.min(x.length, y.length);
  for (let i = 0; i < n; i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

/**
 * Compact JSON, keys sorted and numbers written like serde_json (an integer literal within
 * u64 or i64 as the integer, anything else as its double).
 * @param {unknown} v a value from `parse` (Maps, arrays, JsonNumbers, ...) or a plain number
 */
export function toJson(v) {
  if (v instanceof Map) {
    const keys = [...v.keys()].sort(byCodePoint);
    return `{${keys.map((k) => `${JSON.stringify(k)}:${toJson(v.get(k))}`).join(',')}}`;
  }
  if (Array.isArray(v)) return `[${v.map(toJson).join(',')}]`;
  if (v instanceof JsonNumber) {
    const t = v.literal;
    if (!/[.eE]/.test(t) && t !== '-0') {
      const n = BigInt(t);
      if (n >= I64_MIN && n <= U64_MAX) return n.toString();
    }
    return ryu(v.value);
  }
  if (typeof v === 'number') return ryu(v);
  return JSON.stringify(v);
}

/** Rust's `f64::round`: halves away from zero. */
function roundHalfAway(x) {
  const a = Math.abs(x);
  let r = Math.floor(a);
  if (a - r >= 0.5) r += 1;
  return x < 0 ? -r : r;
}

/** A SKU as a URL path segment: RFC 3986 unreserved bytes as they are, the rest %XX. */
function pathSegment(s) {
  let out = '';
  for (const b of encoder.encode(s)) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9\-_.~]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/**
 * `{order, sku, quantity}`, or the rejection reason (a string).
 * @param {Uint8Array | null} value
 */
export function parseOrder(value) {
  if (value === null) return 'null value (tombstone)';
  let order;
  try {
    order = parse(value);
  } catch (e) {
    // The reason is the same in every language; the parser's own words go to the log.
    log.debug(`not JSON: ${e.message}`);
    return 'not JSON';
  }
  if (!(order instanceof Map)) return 'not a JSON object';
  const sku = order.get('sku');
  if (typeof sku !== 'string' || sku.length === 0) return '`sku` missing, empty or not a string';
  const q = order.get('quantity');
  const quantity = q instanceof JsonNumber ? q.asU64() : null;
  if (quantity === null || quantity === 0n) return '`quantity` missing or not a positive integer';
  return { order, sku, quantity };
}

/** Ask again after `ms`; `why` is logged. */
class Later {
  constructor(ms, why) {
    this.ms = ms;
    this.why = why;
  }
}
const UNKNOWN = Symbol('unknown sku');

/** The enricher. */
export default class Enricher extends Plugin {
  init(config) {
    const url = config.get('pricing-url');
    if (url === undefined) throw new Error('set `pricing-url` (e.g. http://127.0.0.1:8088)');
    this.pricingUrl = url.replace(/\/+$/, '');
    let parsed;
    try {
      parsed = new URL(`${this.pricingUrl}/price/x`);
    } catch {
      throw new Error(`pricing-url \`${this.pricingUrl}\`: not an absolute http:// or https:// URL`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new Error(`pricing-url \`${this.pricingUrl}\`: scheme \`${parsed.protocol.slice(0, -1)}\` is not http or https`);
    }
    const raw = config.get('retry-after-ms');
    if (raw === undefined) this.retryAfterMs = 2000;
    else if (WHOLE.test(raw) && BigInt(raw) <= U32_MAX) this.retryAfterMs = Number(raw);
    else throw new Error(`retry-after-ms \`${raw}\`: not a whole number of milliseconds`);
    this.token = config.secret('api-token');
    this.output = config.get('output', 'enriched');
  }

  /** Asks the pricing service about one SKU: a price, UNKNOWN or a Later. */
  async price(sku) {
    const headers = this.token === undefined ? {} : { authorization: `Bearer ${this.token}` };
    let response;
    let body;
    try {
      response = await fetch(`${this.pricingUrl}/price/${pathSegment(sku)}`, { headers });
      body = new Uint8Array(await response.arrayBuffer());
    } catch (e) {
      return new Later(this.retryAfterMs, `${e.name}: ${e.message}`);
    }
    if (response.status >= 200 && response.status < 300) {
      let p;
      try {
        const v = parse(body);
        p = v instanceof Map ? v.get('unit_price') : undefined;
      } catch {
        p = undefined;
      }
      if (p instanceof JsonNumber && Number.isFinite(p.value)) return p.value;
      return new Later(this.retryAfterMs, 'pricing service answered without a numeric `unit_price`');
    }
    if (response.status === 404) return UNKNOWN;
    // A `Retry-After` in seconds (429, 503) is honoured when it asks for longer.
    let asked = 0;
    const header = response.headers.get('retry-after');
    if (header !== null && WHOLE.test(header.trim()) && BigInt(header.trim()) <= U32_MAX) {
      asked = Math.min(Number(header.trim()) * 1000, Number(U32_MAX));
    }
    return new Later(Math.max(this.retryAfterMs, asked), `pricing service answered ${response.status}`);
  }

  /** Emits the enriched order; the verdict for its record. */
  emit(record, { order, quantity }, unitPrice) {
    // Cents: a total is money, and 0.1 × 3 should read 0.3.
    const total = roundHalfAway(unitPrice * Number(quantity) * 100) / 100;
    order.set('unit_price', unitPrice);
    order.set('total', total);
    try {
      record.emit(this.output, { key: record.key, value: toJson(order) });
    } catch (e) {
      if (!(e instanceof EmitError)) throw e;
      if (e.kind === 'too-many-emits' || e.kind === 'too-many-bytes') {
        // The batch's budget is spent: the order comes back in a later batch.
        log.debug(`offset ${record.offset}: ${e.message}; released`);
        return release();
      }
      // A manifest without our output: wait for the operator rather than lose orders.
      log.error(`offset ${record.offset}: emit refused: ${e.message}`);
      return retry(this.retryAfterMs);
    }
    return accept();
  }

  async handleBatch(records) {
    const orders = records.map((r) => parseOrder(r.value));
    // One lookup per distinct SKU of the batch, all in flight at once.
    const position = new Map();
    for (const o of orders) {
      if (typeof o !== 'string' && !position.has(o.sku)) position.set(o.sku, position.size);
    }
    const prices = await Promise.all([...position.keys()].map((sku) => this.price(sku)));
    const later = prices.find((p) => p instanceof Later);
    if (later) log.warn(`pricing lookups will be retried in ${later.ms} ms: ${later.why}`);
    return records.map((record, i) => {
      const o = orders[i];
      if (typeof o === 'string') return reject(o);
      const p = prices[position.get(o.sku)];
      if (p === UNKNOWN) return reject(`unknown sku \`${o.sku}\``);
      if (p instanceof Later) return retry(p.ms);
      return this.emit(record, o, p);
    });
  }
}

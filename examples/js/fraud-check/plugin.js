/**
 * Checks each order with a fraud-scoring service: the plugin guide's worked example of a plugin
 * that acts (docs/plugin-guide.md, section 8), the JavaScript twin of examples/fraud-check (Rust).
 *
 * Each record's value is a JSON order, `{"id": "o-1", "amount": 120.5, "customer": "c-7"}`. The
 * plugin POSTs it as it is to `score-url` with `Authorization: Bearer TOKEN` and reads
 * `{"score": N}` back: a score up to `max-score` emits the order with `"score": N` to the output
 * `scored` (keyed by its id) and accepts; a higher one rejects (`score 95 > 80`); a 5xx or no
 * answer retries after 1000 ms; any other status rejects naming it. A tombstone, a value that is
 * not JSON and an order without a string `id` are rejected, never sent.
 *
 * Configuration: `score-url` (required), `max-score` (a whole number, default 80). Secret:
 * `scoring-token` (required).
 */

import { EmitError, Plugin, accept, log, reject, release, retry } from '@sharehost/guest';

// How long a record waits before it comes back when the service did not answer (or failed):
// long enough for a restarting service, short enough to catch up soon after.
const RETRY_MS = 1000;

/** The fraud check, with what `init` read from the pipeline. */
export default class FraudCheck extends Plugin {
  init(config) {
    this.scoreUrl = config.get('score-url');
    if (this.scoreUrl === undefined) throw new Error('set `score-url` (e.g. http://127.0.0.1:8088/score)');
    // A URL that cannot be sent would fail every record: refuse it at load instead.
    let protocol = null;
    try {
      protocol = new URL(this.scoreUrl).protocol;
    } catch {
      // not a URL at all: refused below
    }
    if (protocol !== 'http:' && protocol !== 'https:') {
      throw new Error(`score-url \`${this.scoreUrl}\`: not an absolute http:// or https:// URL`);
    }
    const raw = config.get('max-score', '80');
    if (!/^[0-9]+$/.test(raw)) throw new Error(`max-score \`${raw}\` is not a whole number`);
    this.maxScore = Number(raw);
    // Without it every call would be refused, and every order rejected.
    this.token = config.secret('scoring-token');
    if (this.token === undefined) throw new Error('set the secret `scoring-token` ([pipeline.secrets])');
  }

  // `async`: the component runs the event loop, so the calls of a batch are in flight together.
  async handle(record) {
    if (record.value === null) return reject('tombstone');
    const text = record.valueText(); // null: not UTF-8, so not JSON either
    let order;
    try {
      order = JSON.parse(text ?? '');
    } catch {
      return reject('not JSON');
    }
    const id = order?.id;
    if (typeof id !== 'string') return reject('`id` missing or not a string');
    let response;
    let body;
    try {
      response = await fetch(this.scoreUrl, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${this.token}` },
        body: text,
      });
      body = await response.text();
    } catch (e) {
      // No answer: the service may be restarting, so the order comes back later.
      log.warn(`order ${id}: ${e.message}; again in ${RETRY_MS} ms`);
      return retry(RETRY_MS);
    }
    if (response.status >= 500 && response.status <= 599) {
      log.warn(`order ${id}: scoring service answered ${response.status}; again in ${RETRY_MS} ms`);
      return retry(RETRY_MS);
    }
    if (response.status !== 200) return reject(`scoring service answered ${response.status}`);
    let score;
    try {
      score = JSON.parse(body)?.score;
    } catch {
      // not JSON: no score, refused below
    }
    if (!Number.isSafeInteger(score)) return reject('scoring service answered without an integer `score`');
    if (score > this.maxScore) return reject(`score ${score} > ${this.maxScore}`);
    // Produced only if this record ends accepted, and before its accept reaches the broker.
    try {
      record.emit('scored', { key: id, value: JSON.stringify({ ...order, score }) });
    } catch (e) {
      if (!(e instanceof EmitError)) throw e;
      // The batch's emit budget is spent: the order comes back in a later batch.
      log.warn(`order ${id}: ${e.message}`);
      return release();
    }
    return accept();
  }
}

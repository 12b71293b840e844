// The enricher's unit tests, natively (node --test): testing.mockFetch answers the lookups
// (the Rust example's tests, in JavaScript).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { accept, reject, release, retry, EmitError } from '@sharehost/guest';
import * as testing from '@sharehost/guest/testing';
import Enricher, { ryu, toJson } from '../plugin.js';

const URL = 'http://127.0.0.1:8088';
const text = (b) => new TextDecoder().decode(b);

/** A pricing service: A-1 costs 2.5, B-2 costs 0.1, anything else is unknown. */
function prices() {
  testing.mockFetch((req) => {
    const price = { 'A-1': '2.5', 'B-2': '0.1' }[req.url.split('/').pop()];
    return price === undefined ? new Response('', { status: 404 }) : new Response(`{"unit_price":${price}}`);
  });
}

const judge = (e, ...values) => e.handleBatch(testing.records(values.map((value) => ({ value, key: 'k' }))));

test('a priced order is emitted enriched to the output and accepted', async () => {
  testing.reset();
  prices();
  const e = testing.create(Enricher, { 'pricing-url': URL });
  const verdicts = await judge(e, '{"id":"o1","sku":"A-1","quantity":3}', '{"id":"o2","sku":"B-2","quantity":3,"note":"x"}');
  assert.deepEqual(verdicts, [accept(), accept()]);
  const emits = testing.takeEmits();
  assert.deepEqual(emits.map((m) => [m.recordIndex, m.output, text(m.key)]), [[0, 'enriched', 'k'], [1, 'enriched', 'k']]);
  assert.equal(text(emits[0].value), '{"id":"o1","quantity":3,"sku":"A-1","total":7.5,"unit_price":2.5}');
  const second = JSON.parse(text(emits[1].value));
  assert.equal(second.total, 0.3, 'totals are rounded to cents');
  assert.equal(second.note, 'x', "the order's other fields are kept");
});

test('an unknown sku is rejected with a reason and emits nothing', async () => {
  testing.reset();
  prices();
  const e = testing.create(Enricher, { 'pricing-url': URL });
  assert.deepEqual(await judge(e, '{"id":"o1","sku":"Z-9","quantity":1}'), [reject('unknown sku `Z-9`')]);
  assert.deepEqual(testing.takeEmits(), []);
});

test('malformed orders are rejected with what is wrong and never looked up', async () => {
  testing.reset();
  prices();
  const e = testing.create(Enricher, { 'pricing-url': URL });
  const verdicts = await judge(e, '{oops', '[1]', '{"sku":"A-1"}', '{"sku":"","quantity":1}', '{"sku":"A-1","quantity":0}', '{"sku":"A-1","quantity":2.0}');
  assert.deepEqual(verdicts, [
    reject('not JSON'),
    reject('not a JSON object'),
    reject('`quantity` missing or not a positive integer'),
    reject('`sku` missing, empty or not a string'),
    reject('`quantity` missing or not a positive integer'),
    reject('`quantity` missing or not a positive integer'),
  ]);
  assert.deepEqual(testing.takeRequests(), []);
  assert.deepEqual(testing.takeEmits(), []);
});

test('a batch asks once per distinct sku, all at once, with the bearer token', async () => {
  testing.reset();
  let inFlight = 0;
  let most = 0;
  testing.mockFetch(async (req) => {
    inFlight++;
    most = Math.max(most, inFlight);
    await new Promise((r) => setImmediate(r));
    inFlight--;
    return req.url.endsWith('/A-1') || req.url.endsWith('/B-2') ? new Response('{"unit_price":1}') : new Response('', { status: 404 });
  });
  const e = testing.create(Enricher, { 'pricing-url': `${URL}/` }, { 'api-token': 't0ken' });
  const verdicts = await judge(e, '{"sku":"A-1","quantity":1}', '{"sku":"B-2","quantity":1}', '{"sku":"A-1","quantity":2}', '{"sku":"a b/c","quantity":2}');
  assert.deepEqual(verdicts.slice(0, 3), [accept(), accept(), accept()]);
  const sent = testing.takeRequests();
  assert.deepEqual(sent.map((r) => r.url), [`${URL}/price/A-1`, `${URL}/price/B-2`, `${URL}/price/a%20b%2Fc`]);
  assert.ok(sent.every((r) => r.headers.get('authorization') === 'Bearer t0ken'));
  assert.equal(most, 3, 'the three lookups were in flight together (Promise.all)');
  assert.equal(testing.takeEmits().length, 3);
});

test('without the secret no authorization header is sent', async () => {
  testing.reset();
  prices();
  await judge(testing.create(Enricher, { 'pricing-url': URL }), '{"sku":"A-1","quantity":1}');
  const [sent] = testing.takeRequests();
  assert.equal(sent.headers.get('authorization'), null);
});

test('a 429, a 5xx or no answer is retried after the configured delay', async () => {
  testing.reset();
  testing.mockFetch((req) => {
    const sku = req.url.split('/').pop();
    if (sku === 'busy') return new Response('', { status: 429 });
    if (sku === 'down') return new Response('', { status: 503 });
    if (sku === 'slow') return new Response('', { status: 429, headers: { 'Retry-After': '7' } });
    throw testing.networkError();
  });
  const e = testing.create(Enricher, { 'pricing-url': URL, 'retry-after-ms': '1500' });
  const verdicts = await judge(e, '{"sku":"busy","quantity":1}', '{"sku":"down","quantity":1}', '{"sku":"gone","quantity":1}', '{"sku":"slow","quantity":1}');
  assert.deepEqual(verdicts, [retry(1500), retry(1500), retry(1500), retry(7000)]);
  assert.deepEqual(testing.takeEmits(), [], 'a retried order emits nothing');
  assert.equal(testing.takeLogs().at(-1).level, 'warn');
});

test('a refused emit releases the order instead of accepting it', async () => {
  testing.reset();
  prices();
  testing.refuseEmits((emit) => (emit.recordIndex === 0 ? null : new EmitError('too-many-emits', 1)));
  const e = testing.create(Enricher, { 'pricing-url': URL });
  assert.deepEqual(await judge(e, '{"sku":"A-1","quantity":1}', '{"sku":"A-1","quantity":2}'), [accept(), release()]);
  assert.equal(testing.takeEmits().length, 1);
});

test('init refuses a missing or unusable pricing url', () => {
  assert.throws(() => testing.create(Enricher, {}), /set `pricing-url`/);
  for (const url of ['127.0.0.1:8088', 'ftp://host', '/relative']) {
    assert.throws(() => testing.create(Enricher, { 'pricing-url': url }), new RegExp(`^Error: pricing-url \`${url.replace(/[.]/g, '\\.')}\``));
  }
  assert.throws(() => testing.create(Enricher, { 'pricing-url': URL, 'retry-after-ms': 'soon' }), /^Error: retry-after-ms `soon`/);
});

test('the component path: an async plugin gives one wire verdict per record', async () => {
  testing.reset();
  prices();
  const [verdicts] = await testing.run(Enricher, [[{ value: '{"sku":"A-1","quantity":1}' }, { value: '{"sku":"Q","quantity":1}' }]], { config: { 'pricing-url': URL } });
  assert.deepEqual(verdicts, [{ tag: 'accept' }, { tag: 'reject', val: 'unknown sku `Q`' }]);
});

test('numbers are written the way serde_json writes them', () => {
  assert.deepEqual([7, 0.3, 1e16, 1.5e-7, 0.00001, -0, 4.611686018427388e19].map(ryu), ['7.0', '0.3', '1e+16', '1.5e-7', '0.00001', '-0.0', '4.611686018427388e+19']);
  assert.equal(toJson(new Map([['b', [1.5]], ['a', 'é\n']])), '{"a":"é\\n","b":[1.5]}');
});

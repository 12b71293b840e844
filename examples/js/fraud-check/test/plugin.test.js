// The fraud check's unit tests, natively (node --test): testing.mockFetch plays the scoring
// service (the Rust example's tests, in JavaScript).

import { beforeEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { EmitError, accept, reject, release, retry } from '@sharehost/guest';
import * as testing from '@sharehost/guest/testing';
import FraudCheck from '../plugin.js';

const URL = 'http://127.0.0.1:8088/score';
const ORDER = '{"id":"o-1","amount":120.5,"customer":"c-7"}';
const text = (b) => new TextDecoder().decode(b);

// A fresh fake host per test: no mock, no collected emits or requests.
beforeEach(() => testing.reset());

const fraudCheck = (config = {}) => testing.create(FraudCheck, { 'score-url': URL, ...config }, { 'scoring-token': 't0ken' });

/** The scoring service answers every call with `status` and `body`. */
const service = (status, body = '') => testing.mockFetch(() => new Response(body, { status }));

const judge = (value, config) => fraudCheck(config).handle(testing.record({ value }));

test('a low score emits the scored order keyed by its id and accepts', async () => {
  service(200, '{"score":12}');
  assert.deepEqual(await judge(ORDER), accept());
  const [sent, ...more] = testing.takeRequests();
  assert.equal(more.length, 0);
  assert.deepEqual([sent.method, sent.url, await sent.text()], ['POST', URL, ORDER]);
  assert.equal(sent.headers.get('content-type'), 'application/json');
  assert.equal(sent.headers.get('authorization'), 'Bearer t0ken');
  const [emit, ...others] = testing.takeEmits();
  assert.equal(others.length, 0);
  assert.deepEqual([emit.output, text(emit.key)], ['scored', 'o-1']);
  assert.deepEqual(JSON.parse(text(emit.value)), { id: 'o-1', amount: 120.5, customer: 'c-7', score: 12 });
});

test('a score over the max is rejected naming both and emits nothing', async () => {
  service(200, '{"score":95}');
  assert.deepEqual(await judge(ORDER), reject('score 95 > 80'));
  assert.deepEqual(testing.takeEmits(), []);
  assert.deepEqual(await judge(ORDER, { 'max-score': '95' }), accept());
});

test('a 5xx is retried after a second and emits nothing', async () => {
  for (const status of [500, 503]) {
    service(status);
    assert.deepEqual(await judge(ORDER), retry(1000), `${status}`);
    assert.deepEqual(testing.takeEmits(), []);
  }
});

test('a refused connection is retried after a second', async () => {
  testing.mockFetch(() => {
    throw testing.networkError();
  });
  assert.deepEqual(await judge(ORDER), retry(1000));
});

test('any other status or an answer without a score is rejected naming it', async () => {
  service(404);
  assert.deepEqual(await judge(ORDER), reject('scoring service answered 404'));
  for (const body of ['{"score":"low"}', '{"score":true}', '[]', 'oops', 'null']) {
    service(200, body);
    assert.deepEqual(await judge(ORDER), reject('scoring service answered without an integer `score`'), body);
  }
});

test('a tombstone, non-JSON or an order without an id is rejected and never sent', async () => {
  service(200, '{"score":1}');
  assert.deepEqual(await judge(null), reject('tombstone'));
  assert.deepEqual(await judge('{oops'), reject('not JSON'));
  assert.deepEqual(await judge(new Uint8Array([0xff])), reject('not JSON'));
  for (const noId of ['{"amount":5}', '{"id":7}', '[1]', 'null']) {
    assert.deepEqual(await judge(noId), reject('`id` missing or not a string'), noId);
  }
  assert.deepEqual(testing.takeRequests(), []);
});

test('a refused emit releases the order', async () => {
  service(200, '{"score":1}');
  testing.refuseEmits(() => new EmitError('too-many-emits', 1));
  assert.deepEqual(await judge(ORDER), release());
});

test('init refuses a configuration without score-url, a token or a whole max-score', () => {
  const token = { 'scoring-token': 't0ken' };
  assert.throws(() => testing.create(FraudCheck, {}, token), /^Error: set `score-url`/);
  assert.throws(() => testing.create(FraudCheck, { 'score-url': '/score' }, token), /^Error: score-url `\/score`/);
  for (const bad of ['lots', '-1', '8.5', '', '²']) {
    assert.throws(() => testing.create(FraudCheck, { 'score-url': URL, 'max-score': bad }, token), { message: `max-score \`${bad}\` is not a whole number` });
  }
  assert.throws(() => testing.create(FraudCheck, { 'score-url': URL }), /^Error: set the secret `scoring-token`/);
});

test('the component path: one wire verdict per record, the calls of a batch in flight together', async () => {
  let inFlight = 0;
  let most = 0;
  testing.mockFetch(async (req) => {
    inFlight++;
    most = Math.max(most, inFlight);
    const { id } = JSON.parse(await req.text());
    await new Promise((r) => setImmediate(r));
    inFlight--;
    return new Response(id === 'low' ? '{"score":1}' : '{"score":99}');
  });
  const orders = [{ value: '{"id":"low"}' }, { value: '{"id":"high"}' }, { value: null }];
  const [verdicts] = await testing.run(FraudCheck, [orders], { config: { 'score-url': URL }, secrets: { 'scoring-token': 't0ken' } });
  assert.deepEqual(verdicts, [{ tag: 'accept' }, { tag: 'reject', val: 'score 99 > 80' }, { tag: 'reject', val: 'tombstone' }]);
  assert.equal(most, 2, 'both calls were in flight at once');
});

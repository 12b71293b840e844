// Injected by sharehost-build-js in place of the global `fetch` (esbuild `inject`): esbuild
// keeps this module in a bundle only where the plugin calls `fetch`, and the string below
// tells the build to enable componentize-js's HTTP support (wasi:http) for it. A plugin that
// never fetches is built without wasi:http and needs no grant. Natively the plugin is not
// bundled: its `fetch` is the global one (under test, `testing.mockFetch`'s).

const USES_FETCH = 'sharehost:uses-fetch';

/**
 * The standard `fetch`, through the engine's wasi:http client: each request goes to the
 * host, which sends it only to the pipeline's `allowed_outbound_hosts`. A request that gets
 * no response (refused by the host, unreachable, past `http_timeout_ms`) rejects with a
 * TypeError; the host logs which.
 * @param {RequestInfo | URL} input
 * @param {RequestInit} [init]
 * @returns {Promise<Response>}
 */
export function fetch(input, init) {
  const f = globalThis.fetch;
  if (typeof f !== 'function') return Promise.reject(new TypeError(`${USES_FETCH}: fetch is not available`));
  return f(input, init);
}

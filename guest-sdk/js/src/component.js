// The component glue: what `sharehost-build-js` bundles around a plugin module. It connects
// the SDK to the host's imports, routes `console` to the host log, and exports the world's
// `init` and `handle`. Only a component build imports this file: the `sharehost:plugin/*`
// modules exist nowhere else.

import { log as hostLog } from 'sharehost:plugin/host@0.2.0';
import { emit as hostEmit } from 'sharehost:plugin/outputs@0.2.0';
import { getStderr } from 'wasi:cli/stderr@0.2.12';
import { setBackend } from './host.js';
import { EmitError } from './errors.js';
import { Runner, format } from './index.js';
import { where } from './stack.js';

setBackend({
  log(level, message) {
    hostLog(level, message);
  },
  emit(recordIndex, output, key, value, headers) {
    try {
      // option<list<u8>>: `undefined` is none.
      hostEmit(
        recordIndex,
        output,
        key ?? undefined,
        value ?? undefined,
        headers.map((h) => ({ key: h.key, value: h.value ?? undefined })),
      );
    } catch (e) {
      // componentize-js throws an Error whose `payload` is the WIT `emit-error` variant.
      const p = e?.payload;
      if (p && typeof p.tag === 'string') throw new EmitError(p.tag, p.val === undefined ? undefined : typeof p.val === 'bigint' ? Number(p.val) : p.val);
      throw e;
    }
  },
});

// With the build's `--disable stdio` (stdio would pull in wasi:filesystem, which the host
// refuses) console output would vanish: send it to the host log instead, one line per call.
const route = (level) => (...args) => hostLog(level, format(...args));
for (const [name, level] of [
  ['log', 'info'],
  ['info', 'info'],
  ['debug', 'debug'],
  ['trace', 'trace'],
  ['warn', 'warn'],
  ['error', 'error'],
]) {
  try {
    globalThis.console[name] = route(level);
  } catch {
    // a frozen console: leave it as it is
  }
}

const encoder = new TextEncoder();

/**
 * Writes one line saying what failed and where (in the plugin's own source) to the
 * component's stderr, just before the instance traps: the host's fault text shows the last
 * stderr line of a failed call (Rust panics reach it the same way).
 * @param {unknown} e
 */
function report(e) {
  const name = e instanceof Error ? e.name : typeof e;
  let message = e instanceof Error ? e.message : String(e);
  if (message.length > 400) message = `${message.slice(0, 400)}...`;
  const at = where(e);
  const line = `plugin fault: ${name}: ${message}${at ? ` (at ${at})` : ''}`.replace(/\n/g, ' ');
  try {
    getStderr().blockingWriteAndFlush(encoder.encode(`${line}\n`));
  } catch {
    // the host log line already says it
  }
}

/**
 * Exports a plugin definition as the world's `init` and `handle` functions.
 * @param {import('./index.js').PluginDefinition} definition
 */
export function exportPlugin(definition) {
  const runner = new Runner(definition);
  // componentize-js turns a thrown error into `result::err` of the export; its payload must
  // be the string.
  const settle = (refused) => {
    if (refused !== null) throw refused;
  };
  return {
    init(config, secrets) {
      const refused = runner.init(config, secrets);
      if (refused instanceof Promise) return refused.then(settle);
      return settle(refused);
    },
    handle(batch) {
      try {
        const verdicts = runner.handle(batch);
        if (verdicts instanceof Promise) {
          return verdicts.catch((e) => {
            report(e);
            throw e;
          });
        }
        return verdicts;
      } catch (e) {
        report(e);
        throw e;
      }
    },
  };
}

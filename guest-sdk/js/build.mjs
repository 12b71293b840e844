#!/usr/bin/env node
// sharehost-build-js: turns a plugin module (ES module, `export default` a plugin class or
// object, importing `@sharehost/guest`) into a WebAssembly component the sharehost host
// accepts (world `plugin` of `sharehost:plugin@0.2.0`).
//
//   sharehost-build-js PLUGIN.js OUT.wasm [--wit WIT_FILE_OR_DIR] [--keep-bundle]
//
// Steps, and why:
//  1. esbuild bundles the plugin, this SDK and the component glue (src/component.js) into one
//     ES module: componentize-js takes one source file and resolves no npm packages.
//     `@sharehost/guest` always resolves to this SDK copy (one host backend in the bundle);
//     `sharehost:plugin/*` stays external (those are the component's imports).
//  2. componentize-js (pinned, see package.json) splices the bindings into StarlingMonkey
//     and pre-initializes the module with Wizer, with `--disable stdio http fetch-event`:
//       - `http` and `fetch-event` would import wasi:http (refused unless a pipeline grants
//         hosts) and export an HTTP handler the world does not have;
//       - `stdio` would import wasi:filesystem (always refused), so it goes too; the SDK
//         routes `console.*` to the host log instead, so nothing vanishes.
//     `random` and `clocks` stay: the host grants them (Math.random is seeded at run time,
//     Date.now works).
//  3. The component's imports are checked against what the host allows without a grant
//     (listed by jco's `componentWit`); anything else fails the build, naming the import.
//
// The toolchain is installed from this package's lockfile (`npm ci`) the first time, when it
// is missing.

import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const SDK_DIR = dirname(fileURLToPath(import.meta.url));
/** The WIT features componentize-js must leave out (see the header comment). */
export const DISABLED_FEATURES = ['stdio', 'http', 'fetch-event'];
/**
 * The interfaces the host lets a plugin import without a grant (host/runtime/src/validate.rs).
 * The build checks its output against them, so a toolchain that starts importing more fails
 * here, naming the import, rather than at load in the host.
 */
const ALLOWED_IMPORTS = [
  'sharehost:plugin/host', 'sharehost:plugin/types', 'sharehost:plugin/outputs',
  'wasi:cli/environment', 'wasi:cli/exit', 'wasi:cli/stdin', 'wasi:cli/stdout', 'wasi:cli/stderr',
  'wasi:cli/terminal-input', 'wasi:cli/terminal-output', 'wasi:cli/terminal-stdin',
  'wasi:cli/terminal-stdout', 'wasi:cli/terminal-stderr', 'wasi:io/error', 'wasi:io/poll',
  'wasi:io/streams', 'wasi:clocks/wall-clock', 'wasi:clocks/monotonic-clock',
  'wasi:random/random', 'wasi:random/insecure', 'wasi:random/insecure-seed',
];

function usage(msg) {
  if (msg) process.stderr.write(`sharehost-build-js: ${msg}\n`);
  process.stderr.write('usage: sharehost-build-js PLUGIN.js OUT.wasm [--wit WIT_FILE_OR_DIR] [--keep-bundle]\n');
  process.exit(2);
}

/** Finds the contract: --wit, else the SDK's own copy, else the repository's `wit/`. */
function findWit(explicit) {
  const candidates = explicit ? [explicit] : [join(SDK_DIR, 'wit', 'plugin.wit'), join(SDK_DIR, '..', '..', 'wit', 'plugin.wit')];
  for (const c of candidates) if (existsSync(c)) return resolve(c);
  usage(`no WIT found (tried ${candidates.join(', ')}); pass --wit path/to/plugin.wit`);
}

/** Imports a toolchain package, running `npm ci` in the SDK once if it is not installed. */
async function load(name) {
  const req = createRequire(join(SDK_DIR, 'package.json'));
  const resolveIt = () => {
    try {
      return req.resolve(name);
    } catch {
      // ESM-only packages have no `require` condition: look for the package directory.
      for (let d = SDK_DIR; ; d = dirname(d)) {
        const p = join(d, 'node_modules', name, 'package.json');
        if (existsSync(p)) {
          const pkg = JSON.parse(readFileSync(p, 'utf8'));
          const exp = pkg.exports?.import ?? pkg.exports?.['.']?.import ?? pkg.module ?? pkg.main ?? 'index.js';
          return join(dirname(p), typeof exp === 'string' ? exp : exp.default);
        }
        if (dirname(d) === d) return null;
      }
    }
  };
  let path = resolveIt();
  if (!path && existsSync(join(SDK_DIR, 'package-lock.json'))) {
    process.stderr.write(`sharehost-build-js: installing the pinned toolchain (npm ci in ${SDK_DIR})\n`);
    const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: SDK_DIR, stdio: 'inherit' });
    if (r.status !== 0) process.exit(r.status ?? 1);
    path = resolveIt();
  }
  if (!path) usage(`cannot find ${name}; run \`npm ci\` in ${SDK_DIR}`);
  return import(pathToFileURL(path).href);
}

async function main(argv) {
  const positional = [];
  let wit;
  let keepBundle = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--wit') wit = argv[++i];
    else if (a === '--keep-bundle') keepBundle = true;
    else if (a === '-h' || a === '--help') usage();
    else if (a.startsWith('-')) usage(`unknown option ${a}`);
    else positional.push(a);
  }
  if (positional.length !== 2) usage('expected PLUGIN.js and OUT.wasm');
  const plugin = resolve(positional[0]);
  const out = resolve(positional[1]);
  if (!existsSync(plugin)) usage(`no such file: ${plugin}`);
  const witPath = findWit(wit);

  const started = performance.now();
  const esbuild = await load('esbuild');
  const { componentize } = await load('@bytecodealliance/componentize-js');

  // 1. Bundle.
  const entry = [
    `import definition from ${JSON.stringify(plugin)};`,
    `import { exportPlugin } from ${JSON.stringify(join(SDK_DIR, 'src', 'component.js'))};`,
    'const plugin = exportPlugin(definition);',
    '/** The world export `init`. */',
    'export function init(config, secrets) { return plugin.init(config, secrets); }',
    '/** The world export `handle`. */',
    'export function handle(batch) { return plugin.handle(batch); }',
    '',
  ].join('\n');
  const sdkEntries = { '': 'index.js', '/testing': 'testing.js' };
  const bundled = await esbuild.build({
    stdin: { contents: entry, resolveDir: dirname(plugin), sourcefile: 'sharehost-entry.js', loader: 'js' },
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    write: false,
    logLevel: 'warning',
    external: ['sharehost:plugin/*'],
    plugins: [
      {
        name: 'sharehost-guest',
        setup(build) {
          build.onResolve({ filter: /^@sharehost\/guest(\/.*)?$/ }, (args) => {
            const sub = args.path.slice('@sharehost/guest'.length);
            const file = sdkEntries[sub];
            if (!file) return { errors: [{ text: `@sharehost/guest has no entry ${args.path}` }] };
            return { path: join(SDK_DIR, 'src', file) };
          });
        },
      },
    ],
  });
  const workDir = join(tmpdir(), `sharehost-build-js-${process.pid}`);
  mkdirSync(workDir, { recursive: true });
  const bundlePath = join(workDir, `${basename(plugin, '.js')}.bundle.js`);
  writeFileSync(bundlePath, bundled.outputFiles[0].text);
  const bundledAt = performance.now();

  // 2. Componentize.
  let component;
  try {
    ({ component } = await componentize({
      sourcePath: bundlePath,
      witPath,
      worldName: 'plugin',
      disableFeatures: DISABLED_FEATURES,
    }));
  } catch (e) {
    process.stderr.write(`sharehost-build-js: componentize-js failed (bundle kept at ${bundlePath}):\n${e?.stack ?? e}\n`);
    process.exit(1);
  }
  const { componentWit } = await load('@bytecodealliance/jco');
  const imports = [...(await componentWit(component)).matchAll(/^\s*import ([a-z0-9-]+:[a-z0-9-]+\/[a-z0-9-]+)(@[^;\s]*)?;/gm)].map((m) => m[1]);
  const refused = imports.filter((i) => !ALLOWED_IMPORTS.includes(i));
  if (refused.length > 0 || !imports.includes('sharehost:plugin/host')) {
    process.stderr.write(`sharehost-build-js: the component imports ${refused.join(', ') || '(no sharehost:plugin/host?)'}, which the host refuses; not written (imports: ${imports.join(', ')})\n`);
    process.exit(1);
  }
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, component);
  if (keepBundle) writeFileSync(out.replace(/\.wasm$/, '') + '.bundle.js', bundled.outputFiles[0].text);
  rmSync(workDir, { recursive: true, force: true });
  const done = performance.now();
  process.stderr.write(
    `sharehost-build-js: ${out} (${(statSync(out).size / 1e6).toFixed(1)} MB) in ${((done - started) / 1000).toFixed(1)} s ` +
      `(bundle ${((bundledAt - started) / 1000).toFixed(1)} s)\n`,
  );
}

await main(process.argv.slice(2));

#!/usr/bin/env node
// sharehost-build-js: turns a plugin module (ES module, `export default` a plugin class or
// object, importing `@sharehost/guest`) into a WebAssembly component the sharehost host
// accepts (world `plugin` of `sharehost:plugin@0.2.0`).
//
//   sharehost-build-js PLUGIN.js OUT.wasm [--wit WIT_FILE_OR_DIR] [--keep-bundle] [--no-cache]
//
// Steps, and why:
//  1. esbuild bundles the plugin, this SDK and the component glue (src/component.js) into one
//     ES module: componentize-js takes one source file and resolves no npm packages.
//     `@sharehost/guest` always resolves to this SDK copy (one host backend in the bundle);
//     `sharehost:plugin/*` and `wasi:*` stay external (those are the component's imports).
//     The global `fetch` is injected from src/fetch.js, so the bundle shows whether the plugin
//     calls it. A table from each bundle line to its source file and line (from esbuild's
//     source map) is appended, so a fault names the plugin's own file and line.
//  2. componentize-js (pinned, see toolchain/package.json) splices the bindings into
//     StarlingMonkey and pre-initializes the module with Wizer, against world `plugin-js`
//     (the contract plus wasi:cli/stderr, where the SDK writes an uncaught exception), with
//     `--disable stdio fetch-event`, and `http` too unless the plugin calls `fetch`:
//       - `http` imports wasi:http, which the host refuses unless a pipeline grants hosts: a
//         plugin that never fetches needs no grant;
//       - `fetch-event` would export an HTTP handler the world does not have;
//       - `stdio` would import wasi:filesystem (always refused), so it goes too; the SDK
//         routes `console.*` to the host log instead, so nothing vanishes.
//     `random` and `clocks` stay: the host grants them (Math.random is seeded at run time,
//     Date.now works).
//  3. The component's imports are checked against what the host allows (with wasi:http only
//     for a plugin that fetches); anything else fails the build, naming the import.
//
// The same inputs give the same bytes. Two runs of componentize-js on one bundle do not:
// Wizer runs the engine's initialization with the host's real WASI randomness and monotonic
// clock, and the snapshot keeps what SpiderMonkey drew from them (hash-code keys, GC
// timestamps), along with the paths of the temporary directories the initialization read;
// componentize-js 0.23.0 and Wizer 10 have no option to fix either. So a component is kept
// under the digest of what it was made from (the bundle, the WIT, the features, the
// toolchain) in ~/.cache/sharehost/js-builds/, and the same inputs are answered with its
// bytes: a rebuild of unchanged source is instant and the host's compile cache keeps its
// entry (`--no-cache` builds anew).
//
// The toolchain is installed from toolchain/package-lock.json (`npm ci`) the first time into
// a per-user cache, ~/.cache/sharehost/js-toolchain/<lock hash>/ ($SHAREHOST_JS_TOOLCHAIN
// overrides), never into the SDK's or the plugin's directory.

import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const SDK_DIR = dirname(fileURLToPath(import.meta.url));
/** The WIT features componentize-js always leaves out (see the header comment). */
export const DISABLED_FEATURES = ['stdio', 'fetch-event'];
/** Marks the bundle of a plugin that calls `fetch` (the string is in src/fetch.js). */
const USES_FETCH = 'sharehost:uses-fetch';
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
/** What a plugin that calls `fetch` imports besides: granted by a pipeline's outbound hosts. */
const HTTP_IMPORTS = ['wasi:http/types', 'wasi:http/outgoing-handler'];

/** `file:line:column: ` of an esbuild message, or nothing when it has no place. */
function where(m) {
  const l = m?.location;
  return l ? `${l.file}:${l.line}:${l.column}: ` : '';
}

/**
 * What a failed bundle tells the author, one line per error and no stack: the plugin module
 * not exporting a plugin as its default (the generated entry imports `default`) is said as
 * that, with the fix; anything else as esbuild located it in the plugin's own files.
 */
export function bundleErrors(errors, plugin, cause) {
  if (errors.length === 0) return `sharehost-build-js: bundling ${plugin} failed: ${cause?.message ?? cause}\n`;
  return errors
    .map((e) =>
      /No matching export in .* for import "default"/.test(e.text)
        ? `sharehost-build-js: ${plugin} has no default export: end it with \`export default class MyPlugin extends Plugin { ... }\` (or \`export default\` an object with handle or handleBatch)\n`
        : `sharehost-build-js: ${where(e)}${e.text}\n`,
    )
    .join('');
}

function usage(msg) {
  if (msg) process.stderr.write(`sharehost-build-js: ${msg}\n`);
  process.stderr.write('usage: sharehost-build-js PLUGIN.js OUT.wasm [--wit WIT_FILE_OR_DIR] [--keep-bundle] [--no-cache]\n');
  process.exit(2);
}

/** Finds the contract: --wit, else the SDK's own copy, else the repository's `wit/`. */
function findWit(explicit) {
  const candidates = explicit ? [explicit] : [join(SDK_DIR, 'wit', 'plugin.wit'), join(SDK_DIR, '..', '..', 'wit', 'plugin.wit')];
  for (const c of candidates) if (existsSync(c)) return resolve(c);
  usage(`no WIT found (tried ${candidates.join(', ')}); pass --wit path/to/plugin.wit`);
}

/**
 * Where the pinned toolchain lives: one directory per lock file in the per-user cache, so
 * every plugin and every copy of the SDK shares it and nothing is written next to them.
 */
export function toolchainDir() {
  if (process.env.SHAREHOST_JS_TOOLCHAIN) return resolve(process.env.SHAREHOST_JS_TOOLCHAIN);
  const lock = readFileSync(join(SDK_DIR, 'toolchain', 'package-lock.json'));
  const id = createHash('sha256').update(lock).digest('hex').slice(0, 16);
  const cache = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
  return join(cache, 'sharehost', 'js-toolchain', id);
}

/** Installs the toolchain into its cache directory (`npm ci` on the pinned lock) once. */
function ensureToolchain() {
  const dir = toolchainDir();
  if (existsSync(join(dir, 'node_modules', '.sharehost-installed'))) return dir;
  process.stderr.write(`sharehost-build-js: installing the pinned toolchain into ${dir} (once)\n`);
  // Installed beside, then moved in whole: a build interrupted half-way leaves no half toolchain.
  const staging = `${dir}.partial-${process.pid}`;
  rmSync(staging, { recursive: true, force: true });
  mkdirSync(staging, { recursive: true });
  for (const f of ['package.json', 'package-lock.json']) copyFileSync(join(SDK_DIR, 'toolchain', f), join(staging, f));
  const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: staging, stdio: 'inherit' });
  if (r.status !== 0) {
    rmSync(staging, { recursive: true, force: true });
    process.exit(r.status ?? 1);
  }
  writeFileSync(join(staging, 'node_modules', '.sharehost-installed'), '');
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dirname(dir), { recursive: true });
  renameSync(staging, dir);
  return dir;
}

/** Imports a toolchain package from the toolchain's cache directory. */
async function load(dir, name) {
  const req = createRequire(join(dir, 'package.json'));
  let path;
  try {
    path = req.resolve(name);
  } catch {
    // ESM-only packages have no `require` condition: read the package's own entry.
    const p = join(dir, 'node_modules', name, 'package.json');
    if (existsSync(p)) {
      const pkg = JSON.parse(readFileSync(p, 'utf8'));
      const exp = pkg.exports?.import ?? pkg.exports?.['.']?.import ?? pkg.exports?.['.']?.default ?? pkg.module ?? pkg.main ?? 'index.js';
      path = join(dirname(p), typeof exp === 'string' ? exp : exp.default);
    }
  }
  if (!path) usage(`cannot find ${name} in ${dir}; remove that directory and build again`);
  return import(pathToFileURL(path).href);
}

/** Components kept by their inputs' digest; the oldest go first. */
const KEPT_BUILDS = 16;

/** Where built components are kept by the digest of their inputs. */
function keptBuilds() {
  const cache = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
  return join(cache, 'sharehost', 'js-builds');
}

/** Every file under `dir`, by relative path, in a fixed order. */
function filesUnder(dir, prefix = '') {
  return readdirSync(dir, { withFileTypes: true })
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    .flatMap((e) => (e.isDirectory() ? filesUnder(join(dir, e.name), `${prefix}${e.name}/`) : [[`${prefix}${e.name}`, join(dir, e.name)]]));
}

/**
 * The SHA-256 of what componentize-js is given: the bundle (with its line table), the WIT
 * (world and contract), the features left out and the toolchain (its directory is named by
 * its lockfile's digest).
 */
export function inputsDigest(source, witDir, features, toolchain) {
  const h = createHash('sha256');
  h.update(`${toolchain}\0${features.join(',')}\0`);
  for (const [rel, path] of filesUnder(witDir)) {
    const data = readFileSync(path);
    h.update(`${rel}\0${data.length}\0`).update(data);
  }
  return h.update(source).digest('hex');
}

/** Keeps `component` as the build of `digest`, dropping the oldest past KEPT_BUILDS; a failure
 * to keep is not the build's failure. */
function keep(digest, component) {
  try {
    const dir = keptBuilds();
    mkdirSync(dir, { recursive: true });
    const part = join(dir, `${digest}.wasm.${process.pid}`);
    writeFileSync(part, component);
    renameSync(part, join(dir, `${digest}.wasm`));
    const builds = readdirSync(dir)
      .filter((f) => f.endsWith('.wasm'))
      .map((f) => [join(dir, f), statSync(join(dir, f)).mtimeMs])
      .sort((a, b) => b[1] - a[1]);
    for (const [old] of builds.slice(KEPT_BUILDS)) rmSync(old, { force: true });
  } catch (e) {
    process.stderr.write(`sharehost-build-js: the build is not kept for the next one (${e?.message ?? e})\n`);
  }
}

/** The WIT the component is built against: world `plugin-js` and its dependencies. */
function writeWit(into, contract) {
  cpSync(join(SDK_DIR, 'world'), into, { recursive: true });
  copyFileSync(contract, join(into, 'deps', 'plugin.wit'));
  return into;
}

/**
 * Per line of the bundle (1-based line n at index n - 1): `[file, line]` of the source it
 * came from, read from esbuild's source map (the first mapping of each line); `null` for the
 * build's own lines. Why by hand: decoding a source map's base64 VLQ segments is a few lines,
 * and the component needs only this table, not a source-map library at run time.
 */
export function lineTable(map, relativeTo) {
  const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  const files = map.sources.map((s) => {
    const abs = resolve(dirname(map.file ?? '.'), s);
    const rel = abs.startsWith(`${relativeTo}/`) ? abs.slice(relativeTo.length + 1) : abs;
    return rel;
  });
  const lines = [];
  let source = 0;
  let line = 0;
  for (const segments of map.mappings.split(';')) {
    let entry = null;
    for (const seg of segments.split(',')) {
      if (seg === '') continue;
      const fields = [];
      let value = 0;
      let shift = 0;
      for (const ch of seg) {
        const digit = B64.indexOf(ch);
        value += (digit & 31) << shift;
        if (digit & 32) {
          shift += 5;
        } else {
          fields.push(value & 1 ? -(value >>> 1) : value >>> 1);
          value = 0;
          shift = 0;
        }
      }
      if (fields.length >= 4) {
        source += fields[1];
        line += fields[2];
        if (entry === null) entry = [source, line + 1];
      }
    }
    lines.push(entry);
  }
  return { files, lines };
}

async function main(argv) {
  const positional = [];
  let wit;
  let keepBundle = false;
  let fresh = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--wit') wit = argv[++i];
    else if (a === '--keep-bundle') keepBundle = true;
    else if (a === '--no-cache') fresh = true;
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
  const toolchain = ensureToolchain();
  const esbuild = await load(toolchain, 'esbuild');
  const { componentize } = await load(toolchain, '@bytecodealliance/componentize-js');

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
  const workDir = join(tmpdir(), `sharehost-build-js-${process.pid}`);
  mkdirSync(workDir, { recursive: true });
  const bundlePath = join(workDir, `${basename(plugin, '.js')}.bundle.js`);
  let bundled;
  try {
    bundled = await esbuild.build({
      stdin: { contents: entry, resolveDir: dirname(plugin), sourcefile: 'sharehost-entry.js', loader: 'js' },
      bundle: true,
      format: 'esm',
      platform: 'neutral',
      target: 'es2022',
      write: false,
      outfile: bundlePath,
      sourcemap: 'external',
      sourcesContent: false,
      inject: [join(SDK_DIR, 'src', 'fetch.js')],
      // Errors are said below, in the plugin's terms (esbuild's would point into the generated
      // entry); warnings as esbuild says them.
      logLevel: 'silent',
      external: ['sharehost:plugin/*', 'wasi:*'],
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
  } catch (e) {
    process.stderr.write(bundleErrors(e?.errors ?? [], plugin, e));
    process.exit(1);
  }
  for (const w of bundled.warnings ?? []) process.stderr.write(`sharehost-build-js: warning: ${where(w)}${w.text}\n`);
  const js = bundled.outputFiles.find((f) => f.path.endsWith('.js'));
  const map = bundled.outputFiles.find((f) => f.path.endsWith('.map'));
  const usesFetch = js.text.includes(USES_FETCH);
  const lines = lineTable({ ...JSON.parse(map.text), file: bundlePath }, dirname(plugin));
  // Appended after the last line, so no line of the bundle moves.
  const source = `${js.text}\nglobalThis.__sharehostSourceLines = ${JSON.stringify(lines)};\n`;
  writeFileSync(bundlePath, source);
  const bundledAt = performance.now();

  // 2. Componentize, unless these very inputs were componentized before.
  const witDir = writeWit(join(workDir, 'wit'), witPath);
  const features = usesFetch ? DISABLED_FEATURES : [...DISABLED_FEATURES, 'http'];
  const digest = inputsDigest(source, witDir, features, toolchain);
  const kept = join(keptBuilds(), `${digest}.wasm`);
  if (!fresh && existsSync(kept)) {
    const component = readFileSync(kept);
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, component);
    if (keepBundle) writeFileSync(out.replace(/\.wasm$/, '') + '.bundle.js', source);
    rmSync(workDir, { recursive: true, force: true });
    const now = new Date();
    utimesSync(kept, now, now);
    process.stderr.write(
      `sharehost-build-js: ${out} (${(component.length / 1e6).toFixed(1)} MB${usesFetch ? ', fetch: imports wasi:http' : ''}, inputs unchanged: the bytes built from them before; --no-cache builds anew) in ${((performance.now() - started) / 1000).toFixed(1)} s\n`,
    );
    return;
  }
  let component;
  try {
    ({ component } = await componentize({
      sourcePath: bundlePath,
      witPath: witDir,
      worldName: 'plugin-js',
      disableFeatures: features,
    }));
  } catch (e) {
    process.stderr.write(`sharehost-build-js: componentize-js failed (bundle kept at ${bundlePath}):\n${e?.stack ?? e}\n`);
    process.exit(1);
  }
  const { componentWit } = await load(toolchain, '@bytecodealliance/jco');
  const imports = [...(await componentWit(component)).matchAll(/^\s*import ([a-z0-9-]+:[a-z0-9-]+\/[a-z0-9-]+)(@[^;\s]*)?;/gm)].map((m) => m[1]);
  const allowed = usesFetch ? [...ALLOWED_IMPORTS, ...HTTP_IMPORTS] : ALLOWED_IMPORTS;
  const refused = imports.filter((i) => !allowed.includes(i));
  if (refused.length > 0 || !imports.includes('sharehost:plugin/host')) {
    process.stderr.write(`sharehost-build-js: the component imports ${refused.join(', ') || '(no sharehost:plugin/host?)'}, which the host refuses; not written (imports: ${imports.join(', ')})\n`);
    process.exit(1);
  }
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, component);
  keep(digest, component);
  if (keepBundle) writeFileSync(out.replace(/\.wasm$/, '') + '.bundle.js', source);
  rmSync(workDir, { recursive: true, force: true });
  const done = performance.now();
  process.stderr.write(
    `sharehost-build-js: ${out} (${(statSync(out).size / 1e6).toFixed(1)} MB${usesFetch ? ', fetch: imports wasi:http' : ''}) in ${((done - started) / 1000).toFixed(1)} s ` +
      `(bundle ${((bundledAt - started) / 1000).toFixed(1)} s)\n`,
  );
}

await main(process.argv.slice(2));

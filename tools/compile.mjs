#!/usr/bin/env node
// Compiles the test contracts in contracts/ with the pinned solc (solcjs) into the committed
// fixtures tests/fixtures/<Name>.json: { contractName, source, compiler, settings, abi, bytecode,
// deployedBytecode }. The output is deterministic: the same sources and compiler give the same
// bytes, because the metadata trailer (which would embed source hashes) is left out.
//
//   node tools/compile.mjs           write the fixtures
//   node tools/compile.mjs --check   compile and fail (exit 1) if a committed fixture differs

import { readFileSync, writeFileSync, mkdirSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const solc = require('solc');

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const fixturesDir = join(repoRoot, 'tests', 'fixtures');
const contracts = [
  'TestToken',
  'TestToken18',
  'PlainToken',
  'PermitToken',
  'Multicall',
  'Permit2',
  'X402ExactPermit2Proxy',
  'X402UptoPermit2Proxy',
  'X402BatchSettlement',
  'ERC3009DepositCollector',
  'Permit2DepositCollector',
  'ReentrantDepositCollector',
];

const settings = {
  optimizer: { enabled: true, runs: 200 },
  evmVersion: 'cancun',
  metadata: { appendCBOR: false },
};

function compile() {
  const sources = {};
  for (const name of contracts) {
    const path = `contracts/${name}.sol`;
    sources[path] = { content: readFileSync(join(repoRoot, path), 'utf8') };
  }
  const input = {
    language: 'Solidity',
    sources,
    settings: {
      ...settings,
      outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object', 'evm.deployedBytecode.object'] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input)));
  // solc's note on transient storage (2394) is expected: X402BatchSettlement keeps its
  // reentrancy lock there and clears it at the end of every call.
  const problems = (output.errors ?? []).filter((p) => p.errorCode !== '2394');
  for (const p of problems) {
    process.stderr.write(`${p.formattedMessage ?? p.message}\n`);
  }
  if (problems.some((p) => p.severity === 'error')) {
    throw new Error('solc reported errors');
  }

  const fixtures = {};
  for (const name of contracts) {
    const path = `contracts/${name}.sol`;
    const out = output.contracts?.[path]?.[name];
    if (!out) throw new Error(`solc produced no output for ${name} in ${path}`);
    const fixture = {
      contractName: name,
      source: path,
      compiler: `solc ${solc.version()}`,
      settings,
      abi: out.abi,
      bytecode: `0x${out.evm.bytecode.object}`,
      deployedBytecode: `0x${out.evm.deployedBytecode.object}`,
    };
    fixtures[name] = `${JSON.stringify(fixture, null, 2)}\n`;
  }
  return fixtures;
}

function main() {
  const args = process.argv.slice(2);
  const check = args.includes('--check');
  const unknown = args.filter((a) => a !== '--check');
  if (unknown.length > 0) {
    process.stderr.write(`unknown argument(s): ${unknown.join(' ')}\nusage: compile.mjs [--check]\n`);
    process.exit(2);
  }

  const fixtures = compile();
  let stale = 0;
  for (const [name, text] of Object.entries(fixtures)) {
    const file = join(fixturesDir, `${name}.json`);
    const rel = `tests/fixtures/${name}.json`;
    if (check) {
      const committed = existsSync(file) ? readFileSync(file, 'utf8') : null;
      if (committed !== text) {
        stale += 1;
        process.stderr.write(`${rel}: ${committed === null ? 'missing' : 'differs from a fresh compile'}\n`);
      } else {
        process.stdout.write(`${rel}: up to date\n`);
      }
    } else {
      mkdirSync(fixturesDir, { recursive: true });
      writeFileSync(file, text);
      process.stdout.write(`${rel}: written\n`);
    }
  }
  if (stale > 0) {
    process.stderr.write('fixtures are stale: run scripts/compile-contracts and commit the result\n');
    process.exit(1);
  }
}

try {
  main();
} catch (err) {
  process.stderr.write(`compile failed: ${err.message}\n`);
  process.exit(1);
}

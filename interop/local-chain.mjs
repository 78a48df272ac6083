// A throwaway local chain for the batch-settlement tests: anvil on a free 127.0.0.1 port, then
// `x402-test-upstream deploy` (TestToken, PlainToken, Multicall3, Permit2, the x402 Permit2
// proxies and the batch-settlement contracts at their canonical addresses), as every local chain
// of the project gets them.
//
//   const chain = await startLocalChain({ mints: ["0x…=1000000"] });
//   … chain.rpcUrl, chain.token, chain.plainToken, chain.chainId …
//   await chain.stop();
//
// Binaries: ANVIL_BIN (scripts/install-tools prints it) and X402_TEST_UPSTREAM_BIN (default
// target/debug/x402-test-upstream).
import { spawn, execFile } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
// anvil's well-known dev account #0 (public test key): deploys.
const DEPLOYER_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

export async function startLocalChain({ chainId = 31337, mints = [], approvePermit2 = [] } = {}) {
  const anvilBin = process.env.ANVIL_BIN;
  if (!anvilBin) throw new Error("ANVIL_BIN is not set (export ANVIL_BIN=$(scripts/install-tools))");
  const upstreamBin = process.env.X402_TEST_UPSTREAM_BIN ?? resolve(root, "target/debug/x402-test-upstream");

  const anvil = spawn(anvilBin, ["--port", "0", "--host", "127.0.0.1", "--chain-id", String(chainId)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const port = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`anvil not listening after 15 s: ${output.slice(-500)}`)), 15_000);
    anvil.stdout.on("data", (chunk) => {
      output += chunk;
      const m = /Listening on 127\.0\.0\.1:(\d+)/.exec(output);
      if (m) {
        clearTimeout(timer);
        ok(Number(m[1]));
      }
    });
    anvil.on("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`anvil exited (${code}): ${output.slice(-500)}`));
    });
  });
  anvil.removeAllListeners("exit");
  anvil.stdout.resume();
  anvil.stderr.resume();
  const rpcUrl = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (anvil.exitCode !== null) return;
    const exited = new Promise((ok) => anvil.once("exit", ok));
    anvil.kill("SIGTERM");
    await exited;
  };

  try {
    const args = ["deploy", "--rpc-url", rpcUrl, "--deployer-key", DEPLOYER_KEY];
    for (const m of mints) args.push("--mint", m);
    for (const k of approvePermit2) args.push("--approve-permit2", k);
    const { stdout } = await promisify(execFile)(upstreamBin, args, { timeout: 120_000 });
    const deployed = JSON.parse(stdout.trim().split("\n").pop());
    return { rpcUrl, chainId, token: deployed.token, plainToken: deployed.plain_token, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

// The OFFICIAL x402 SVM facilitator and resource server over the local Solana test chain
// (tools/solana-chain), shared by interop/svm.mjs (the in-process interop check) and
// interop/svm-server.mjs (the same two, long-running, for a test to pay):
//
//   const official = await startOfficialSvm({ chain, price, feePayer, progress });
//   // official.facilitatorUrl, official.serverUrl, official.exchanges, await official.close()
//
// All on 127.0.0.1, each on a free port:
//   - the official facilitator: @x402/core x402Facilitator + @x402/svm's exact facilitator scheme
//     (v2 on chain.network, CAIP-2 "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", and v1 on
//     "solana-devnet", the names @x402/svm gives the chain whose genesis hash the local chain
//     reports), its fee payer `feePayer` (the chain's fee-payer test key), every RPC call going to
//     the local chain (defaultRpcUrl), served over HTTP: GET /supported, POST /verify, POST /settle
//     (bodies {paymentPayload, paymentRequirements}, like interop/facilitator.mjs), and
//     GET /_exchanges: the verify/settle answers so far, a JSON array of {op, result} or {op, error};
//   - an official express resource server: @x402/express (v2, GET /v2/sol, exact on chain.network)
//     and the legacy x402-express (v1, GET /v1/sol, on "solana-devnet"), both priced `price` atomic
//     units of the chain's test mint, payTo the chain's pay_to key; a paid request answers
//     {"paid":true,"x402Version":2|1}.
// `chain` is the STATEFILE written by scripts/solana-chain, parsed; `feePayer` a @solana/kit
// signer; `price` a bigint. `progress` (optional) receives one-line progress messages.
import { once } from "node:events";
import express from "express";
import { x402Facilitator } from "@x402/core/facilitator";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { paymentMiddlewareFromHTTPServer, x402HTTPResourceServer, x402ResourceServer } from "@x402/express";
import { toFacilitatorSvmSigner } from "@x402/svm";
import { registerExactSvmScheme } from "@x402/svm/exact/facilitator";
import { ExactSvmScheme as ExactSvmServerScheme } from "@x402/svm/exact/server";
import { paymentMiddleware as v1PaymentMiddleware } from "x402-express";

export const NETWORK_V1 = "solana-devnet";

async function listen(app) {
  const server = app.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { server, url: `http://127.0.0.1:${server.address().port}` };
}

export async function startOfficialSvm({ chain, price, feePayer, progress = () => {} }) {
  const NETWORK = chain.network;
  const rpcUrl = chain.rpc_url;
  const PRICE = BigInt(price);

  // ---- the official facilitator, over HTTP
  const facilitator = new x402Facilitator();
  registerExactSvmScheme(facilitator, {
    signer: toFacilitatorSvmSigner(feePayer, { defaultRpcUrl: rpcUrl }),
    networks: [NETWORK],
  });
  const exchanges = [];
  const fApp = express();
  fApp.use(express.json({ limit: "256kb" }));
  fApp.get("/supported", (_req, res) => res.json(facilitator.getSupported()));
  fApp.get("/_exchanges", (_req, res) => res.json(exchanges));
  for (const op of ["verify", "settle"]) {
    fApp.post(`/${op}`, async (req, res) => {
      try {
        const result = await facilitator[op](req.body.paymentPayload, req.body.paymentRequirements);
        exchanges.push({ op, result });
        res.json(result);
      } catch (err) {
        exchanges.push({ op, error: String(err?.message ?? err) });
        res.status(500).json({ error: String(err?.message ?? err) });
      }
    });
  }
  const fac = await listen(fApp);
  progress(`facilitator on ${fac.url} (fee payer ${feePayer.address})`);

  // ---- the official resource server
  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: fac.url })).register(
    NETWORK,
    new ExactSvmServerScheme(),
  );
  const v2Http = new x402HTTPResourceServer(resourceServer, {
    "GET /v2/sol": {
      accepts: { scheme: "exact", network: NETWORK, payTo: chain.pay_to, price: { amount: PRICE.toString(), asset: chain.mint } },
      description: "a paid SVM resource (v2)",
      mimeType: "application/json",
    },
  });
  const sApp = express();
  sApp.use(
    v1PaymentMiddleware(
      chain.pay_to,
      { "GET /v1/sol": { price: { amount: PRICE.toString(), asset: { address: chain.mint, decimals: 6 } }, network: NETWORK_V1 } },
      { url: fac.url },
    ),
  );
  sApp.use(paymentMiddlewareFromHTTPServer(v2Http));
  sApp.get("/v2/sol", (_req, res) => res.json({ paid: true, x402Version: 2 }));
  sApp.get("/v1/sol", (_req, res) => res.json({ paid: true, x402Version: 1 }));
  const srv = await listen(sApp);
  await v2Http.initialize();
  progress(`resource server on ${srv.url}`);

  // Stops accepting, drops open (keep-alive) connections; resolves once both servers closed.
  const close = async () => {
    const closed = [srv.server, fac.server].map((s) => new Promise((resolve) => s.close(() => resolve())));
    srv.server.closeAllConnections();
    fac.server.closeAllConnections();
    await Promise.all(closed);
  };

  return {
    network: NETWORK,
    networkV1: NETWORK_V1,
    facilitator,
    facilitatorUrl: fac.url,
    facilitatorServer: fac.server,
    serverUrl: srv.url,
    server: srv.server,
    exchanges,
    close,
  };
}

// An x402-protected express resource server made of the official middlewares, used by
// scripts/interop as the upstream that x402-router must pay:
//   - x402 v2 routes through @x402/express (PAYMENT-REQUIRED / PAYMENT-SIGNATURE / PAYMENT-RESPONSE),
//     "exact" with EIP-3009, "exact" via Permit2 (/v2/permit2) and "upto" (/v2/upto?used=N: the
//     handler charges N of the authorized maximum with setSettlementOverrides; the same route
//     at /v2/upto-drop and /v2/upto-hold, whose answer is lost once the middleware settled:
//     see "answers lost after settlement" below)
//   - x402 v1 routes through the legacy x402-express (402 JSON body / X-PAYMENT / X-PAYMENT-RESPONSE)
// Both ask the facilitator given on the command line to verify and settle. Binds 127.0.0.1 only.
// GET /v2/batch is paid with the "batch-settlement" scheme (@x402/evm/batch-settlement/server, its
// own payee BATCH_PAY_TO, the facilitator's receiver authorizer, in-memory channel storage): a
// deposit into a payment channel first, then an off-chain voucher per request. POST
// /_batch/claim-settle has the server's official channel manager claim the vouchers it holds and
// settle them to BATCH_PAY_TO through the facilitator (answers {claims, settle}); GET
// /_batch/channels lists the server's channel records. A client refunds itself through the route.
// Bazaar (@x402/extensions/bazaar 2.27.0, declareDiscoveryExtension): GET /v2/weather, POST
// /v2/echo and GET /v2/forecast?city=… declare their input and output schemas in the 402's
// `extensions.bazaar` (the express middleware registers the official server extension, which
// adds the method); a payer that echoes them gets them catalogued by the facilitator.
// GET /v2/siwx is also protected by the official sign-in-with-x extension (@x402/extensions
// 2.27.0: declareSIWxExtension + createSIWxResourceServerExtension, in-memory storage): a payer
// whose payment settled may re-access it by sending SIGN-IN-WITH-X instead of paying. Its
// handler waits ?ms=N (at most 10000) before answering, so that the driver can kill the router
// that paid while the handler runs; GET /_stats counts handler runs and the extension's events.
// GET /v2/permit2-gasless (only with --permit-token: a token with EIP-2612 and without EIP-3009,
// contracts/PermitToken.sol) asks exact via Permit2 in that token and declares the official
// `eip2612GasSponsoring` extension (@x402/extensions 2.27.0): a payer without a Permit2 allowance
// sends its EIP-2612 permit, and the official facilitator submits it (settleWithPermit).
//
//   node interop/server.mjs --token 0x… --facilitator-url http://127.0.0.1:PORT [--port 0]
//                           [--permit-token 0x…]
//   (or INTEROP_TOKEN / INTEROP_FACILITATOR_URL / INTEROP_SERVER_PORT; port 0 = any free port)
//
// stdout: first line is one JSON object once listening (and synced with the facilitator):
//   {"ready":"server","url":"http://127.0.0.1:PORT","pay_to":"0x…","asset":"0x…","routes":[…]}
// then one JSON line per request to a paid route with the payment headers both ways, decoded,
// so that a failed interop check can show exactly what the client sent and what it was told, and
// how long the server took (`handled_ms`); logged when the answer ends or the connection closes.
import { parseArgs } from "node:util";
import express from "express";
import {
  paymentMiddlewareFromHTTPServer,
  setSettlementOverrides,
  x402HTTPResourceServer,
  x402ResourceServer,
} from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme } from "@x402/evm/exact/server";
import { UptoEvmScheme } from "@x402/evm/upto/server";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/server";
import { paymentMiddleware as v1PaymentMiddleware } from "x402-express";
import { declareDiscoveryExtension } from "@x402/extensions/bazaar";
import { declareEip2612GasSponsoringExtension } from "@x402/extensions";
import {
  InMemorySIWxStorage,
  createSIWxResourceServerExtension,
  declareSIWxExtension,
} from "@x402/extensions/sign-in-with-x";
import { randomUUID } from "node:crypto";
import { once } from "node:events";

const NETWORK_V2 = "eip155:84532";
const NETWORK_V1 = "base-sepolia"; // the same chain, by its v1 name
const PAY_TO = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"; // anvil dev account #2
const BATCH_PAY_TO = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"; // anvil dev account #5: /v2/batch's receiver

const { values: opts } = parseArgs({
  options: {
    token: { type: "string", default: process.env.INTEROP_TOKEN },
    "token-name": { type: "string", default: process.env.INTEROP_TOKEN_NAME || "USD Coin" },
    "token-version": { type: "string", default: process.env.INTEROP_TOKEN_VERSION || "2" },
    "facilitator-url": { type: "string", default: process.env.INTEROP_FACILITATOR_URL },
    "permit-token": { type: "string", default: process.env.INTEROP_PERMIT_TOKEN },
    port: { type: "string", default: process.env.INTEROP_SERVER_PORT || "0" },
  },
});
const fail = (msg) => {
  console.error(`server: ${msg}`);
  process.exit(2);
};
const asset = opts.token ?? "";
if (!/^0x[0-9a-fA-F]{40}$/.test(asset)) fail("--token (or INTEROP_TOKEN) must be the token contract address");
if (!opts["facilitator-url"]) fail("--facilitator-url (or INTEROP_FACILITATOR_URL) is required");
const facilitatorUrl = opts["facilitator-url"].replace(/\/+$/, "");
const port = Number(opts.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) fail(`bad port ${opts.port}`);
// EIP-712 domain name/version of the token (the wallet signs against them).
const domain = { name: opts["token-name"], version: opts["token-version"] };
// PermitToken's address and EIP-712 domain (contracts/PermitToken.sol), for /v2/permit2-gasless.
const permitToken = opts["permit-token"];
if (permitToken !== undefined && !/^0x[0-9a-fA-F]{40}$/.test(permitToken)) fail("--permit-token must be an address");
const permitDomain = { name: "Permit Dollar", version: "1" };

// What the Bazaar-declaring routes take and give (examples and JSON schemas).
const forecast = (x402Version) => ({ x402Version, city: "Interop", sky: "clear", temperature_c: 19 });
const BAZAAR = {
  "/v2/weather": declareDiscoveryExtension({
    input: { city: "Interop" },
    inputSchema: { properties: { city: { type: "string", description: "City name" } } },
    output: { example: forecast(2), schema: { properties: { sky: { type: "string" }, temperature_c: { type: "number" } } } },
  }),
  "/v2/echo": declareDiscoveryExtension({
    bodyType: "json",
    input: { hello: "interop" },
    inputSchema: { properties: { hello: { type: "string" } } },
    output: { example: { x402Version: 2, echo: { hello: "interop" } } },
  }),
  "/v2/forecast": declareDiscoveryExtension({
    input: { city: "Paris", days: "3" },
    inputSchema: { properties: { city: { type: "string" }, days: { type: "string", pattern: "^[1-7]$" } }, required: ["city"] },
    output: { example: { city: "Paris", days: [{ sky: "clear", temperature_c: 21 }] } },
  }),
};

// The paid routes, in one table: the driver reads prices from the ready line.
const ROUTES = [
  { method: "GET", path: "/v2/weather", x402_version: 2, amount: "10000", description: "Weather report (x402 v2)" },
  { method: "POST", path: "/v2/echo", x402_version: 2, amount: "20000", description: "Echoes the JSON body (x402 v2)" },
  {
    method: "GET", path: "/v2/forecast", x402_version: 2, amount: "15000",
    description: "Multi-day forecast for a city (x402 v2, declared for Bazaar discovery)",
  },
  { method: "GET", path: "/v1/weather", x402_version: 1, amount: "10000", description: "Weather report (x402 v1)" },
  {
    method: "GET", path: "/v2/permit2", x402_version: 2, amount: "10000", scheme: "exact", transfer: "permit2",
    description: "Weather report, exact via Permit2 (x402 v2)",
  },
  {
    method: "GET", path: "/v2/upto", x402_version: 2, amount: "40000", scheme: "upto", transfer: "permit2",
    description: "Metered: authorize the amount, charged ?used=N (x402 v2)",
  },
  {
    method: "GET", path: "/v2/upto-drop", x402_version: 2, amount: "40000", scheme: "upto", transfer: "permit2",
    description: "Metered like /v2/upto; the connection is destroyed after settlement (x402 v2)",
  },
  {
    method: "GET", path: "/v2/upto-hold", x402_version: 2, amount: "40000", scheme: "upto", transfer: "permit2",
    description: "Metered like /v2/upto; the answer is held ?ms=N after settlement (x402 v2)",
  },
  ...(permitToken
    ? [{
      method: "GET", path: "/v2/permit2-gasless", x402_version: 2, amount: "10000", scheme: "exact", transfer: "permit2",
      asset: permitToken, gas_sponsoring: true,
      description: "Weather report, exact via Permit2 in a token with EIP-2612; gas sponsoring offered (x402 v2)",
    }]
    : []),
  {
    method: "GET", path: "/v2/batch", x402_version: 2, amount: "1000", scheme: "batch-settlement", pay_to: BATCH_PAY_TO,
    description: "Weather report, paid from a batch-settlement channel (x402 v2)",
  },
  {
    method: "GET", path: "/v2/siwx", x402_version: 2, amount: "10000", siwx: true,
    description: "Weather report; payers may re-access it with sign-in-with-x (x402 v2)",
  },
];

// Listen first: the sign-in-with-x extension binds its challenges to this server's origin.
const app = express();
const server = app.listen(port, "127.0.0.1");
server.on("error", (err) => fail(err.message));
await once(server, "listening");
const origin = `http://127.0.0.1:${server.address().port}`;

// ---- v2: an x402ResourceServer with the EVM "exact" scheme; prices given as token amounts.
const v2Routes = {};
for (const r of ROUTES.filter((r) => r.x402_version === 2)) {
  const tokenDomain = r.asset ? permitDomain : domain;
  const extra = r.transfer ? { ...tokenDomain, assetTransferMethod: r.transfer } : { ...tokenDomain };
  v2Routes[`${r.method} ${r.path}`] = {
    accepts: {
      scheme: r.scheme ?? "exact", network: NETWORK_V2, payTo: r.pay_to ?? PAY_TO,
      price: { amount: r.amount, asset: r.asset ?? asset, extra },
    },
    description: r.description,
    mimeType: "application/json",
    ...(r.siwx
      ? { extensions: declareSIWxExtension({ statement: "Sign in to re-access what you paid for", expirationSeconds: 300 }) }
      : {}),
    ...(r.gas_sponsoring ? { extensions: declareEip2612GasSponsoringExtension() } : {}),
    ...(BAZAAR[r.path] ? { extensions: BAZAAR[r.path], serviceName: "Interop Weather", tags: ["weather", "interop"] } : {}),
  };
}
// Counters of the sign-in-with-x route and extension, for GET /_stats.
const siwxStats = { handler_runs: 0, handler_runs_signed_in: 0, payment_recorded: 0, access_granted: 0, validation_failed: 0, nonce_reused: 0 };
const facilitatorClient = new HTTPFacilitatorClient({ url: facilitatorUrl });
// batch-settlement: no receiverAuthorizerSigner of its own, so it delegates that role to the
// facilitator's advertised receiver authorizer; the withdraw delay is the scheme's minimum (900 s).
const batchScheme = new BatchSettlementEvmScheme(BATCH_PAY_TO);
const batchChannels = batchScheme.createChannelManager(facilitatorClient, NETWORK_V2, asset);
const resourceServer = new x402ResourceServer(facilitatorClient)
  .register(NETWORK_V2, new ExactEvmScheme())
  .register(NETWORK_V2, new UptoEvmScheme())
  .register(NETWORK_V2, batchScheme)
  .registerExtension(
    createSIWxResourceServerExtension({
      origin,
      storage: new InMemorySIWxStorage(),
      onEvent: (event) => {
        if (event.type in siwxStats) siwxStats[event.type] += 1;
        emit({ siwx_event: event });
      },
    }),
  );
const v2Http = new x402HTTPResourceServer(resourceServer, v2Routes);

// ---- v1: the legacy middleware; price = atomic amount of an explicit asset.
const v1Routes = {};
for (const r of ROUTES.filter((r) => r.x402_version === 1)) {
  v1Routes[`${r.method} ${r.path}`] = {
    price: { amount: r.amount, asset: { address: asset, decimals: 6, eip712: { ...domain } } },
    network: NETWORK_V1,
    config: { description: r.description, mimeType: "application/json" },
  };
}

// ---- diagnostics: one JSON line per paid-route request, headers decoded.
const emit = (obj) => process.stdout.write(`${JSON.stringify({ at: new Date().toISOString(), ...obj })}\n`);
const decodeB64Json = (value) => {
  if (value === undefined) return undefined;
  try {
    return JSON.parse(Buffer.from(String(value), "base64").toString("utf8"));
  } catch {
    return { undecodable: String(value).slice(0, 500) };
  }
};
const paidPaths = new Set(ROUTES.map((r) => r.path));
function wireLog(req, res, next) {
  if (!paidPaths.has(req.path)) return next();
  const arrived = process.hrtime.bigint();
  const chunks = [];
  let size = 0;
  const keep = (chunk) => {
    if (chunk && typeof chunk !== "function" && size < 4096) {
      const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk));
      chunks.push(buf);
      size += buf.length;
    }
  };
  const write = res.write.bind(res);
  const end = res.end.bind(res);
  res.write = (chunk, ...rest) => {
    keep(chunk);
    return write(chunk, ...rest);
  };
  res.end = (chunk, ...rest) => {
    keep(chunk);
    return end(chunk, ...rest);
  };
  // Logged once: when the answer is written, or when the connection closes before (a
  // dropped connection still shows what the payer sent).
  let logged = false;
  const log = () => {
    if (logged) return;
    logged = true;
    const text = Buffer.concat(chunks).toString("utf8").slice(0, 4096);
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
    emit({
      // The server's own time: from the request's arrival to the end of its answer (x402
      // middleware, facilitator calls and handler included).
      handled_ms: Number(process.hrtime.bigint() - arrived) / 1e6,
      request: {
        method: req.method,
        url: req.originalUrl,
        // the payment headers appear decoded below
        headers: Object.fromEntries(
          Object.entries(req.headers).map(([k, v]) => [k, k === "payment-signature" || k === "x-payment" ? "(decoded below)" : v]),
        ),
        body: req.body,
        "payment-signature (decoded)": decodeB64Json(req.header("payment-signature")),
        "x-payment (decoded)": decodeB64Json(req.header("x-payment")),
      },
      response: {
        status: res.statusCode,
        "payment-required (decoded)": decodeB64Json(res.getHeader("payment-required")),
        "payment-response (decoded)": decodeB64Json(res.getHeader("payment-response")),
        "x-payment-response (decoded)": decodeB64Json(res.getHeader("x-payment-response")),
        body,
      },
    });
  };
  res.on("finish", log);
  res.on("close", log);
  next();
}

// ---- answers lost after settlement. The official middleware buffers the handler's answer,
// settles, sets PAYMENT-RESPONSE and only then writes the buffered answer through the
// response methods it found; those are wrapped here (installed before it), so they see the
// answer after the money moved:
//   /v2/upto-drop: the connection is destroyed instead of answering (the payer never hears);
//   /v2/upto-hold?ms=N: the answer is held N ms (at most 10000), so that the driver can kill
//   the paying client after settlement and before the answer. Each emits one JSON line.
const LOST_ENDINGS = { "/v2/upto-drop": "drop", "/v2/upto-hold": "hold" };
function afterSettlement(req, res, next) {
  const ending = LOST_ENDINGS[req.path];
  if (!ending) return next();
  const ms = Math.max(0, Math.min(Number.parseInt(String(req.query.ms ?? "0"), 10) || 0, 10000));
  for (const method of ["writeHead", "end"]) {
    const original = res[method].bind(res);
    res[method] = (...args) => {
      const header = res.getHeader("payment-response");
      if (header === undefined) return original(...args);
      const settlement = decodeB64Json(header);
      if (ending === "drop") {
        emit({ dropped: req.path, status: res.statusCode, "payment-response (decoded)": settlement });
        req.socket.destroy();
        return res;
      }
      if (method === "writeHead") return original(...args);
      emit({ holding: req.path, ms, status: res.statusCode, "payment-response (decoded)": settlement });
      setTimeout(() => original(...args), ms);
      return res;
    };
  }
  next();
}

app.disable("x-powered-by");
app.use(express.json({ limit: "256kb" }));
app.use(wireLog);
app.use(afterSettlement);
app.get("/healthz", (_req, res) => res.json({ ok: true }));
app.get("/free", (_req, res) => res.json({ free: true }));
app.get("/_stats", (_req, res) => res.json({ siwx: siwxStats }));
// The batch-settlement server's own operations (no payment): claim and settle what it holds.
app.post("/_batch/claim-settle", async (_req, res) => {
  try {
    const result = await batchChannels.claimAndSettle();
    emit({ batch: "claim-settle", result });
    res.json(result);
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    emit({ batch: "claim-settle", error: message });
    res.status(502).json({ error: message });
  }
});
app.get("/_batch/channels", async (_req, res) => res.json(await batchScheme.getStorage().list()));
app.use(v1PaymentMiddleware(PAY_TO, v1Routes, { url: facilitatorUrl }));
app.use(paymentMiddlewareFromHTTPServer(v2Http));

app.get("/v2/weather", (_req, res) => res.json(forecast(2)));
app.get("/v2/forecast", (req, res) => {
  const city = typeof req.query.city === "string" ? req.query.city.slice(0, 64) : "Interop";
  res.json({ x402Version: 2, city, days: [{ sky: "clear", temperature_c: 21 }] });
});
app.post("/v2/echo", (req, res) => res.json({ x402Version: 2, echo: req.body ?? null }));
app.get("/v1/weather", (_req, res) => res.json(forecast(1)));
app.get("/v2/permit2", (_req, res) => res.json({ ...forecast(2), via: "permit2" }));
app.get("/v2/permit2-gasless", (_req, res) => res.json({ ...forecast(2), via: "permit2, gas sponsored" }));
app.get("/v2/batch", (_req, res) => res.json({ ...forecast(2), via: "batch-settlement" }));
const upto = (req, res) => {
  const used = typeof req.query.used === "string" && /^[0-9]{1,20}$/.test(req.query.used) ? req.query.used : "1234";
  setSettlementOverrides(res, { amount: used });
  res.json({ x402Version: 2, upto: true, charged: used });
};
app.get(["/v2/upto", ...Object.keys(LOST_ENDINGS)], upto);
// Paid, or re-accessed by a signed-in payer (the extension granted access: no payment).
app.get("/v2/siwx", async (req, res) => {
  const ms = Math.max(0, Math.min(Number.parseInt(String(req.query.ms ?? "0"), 10) || 0, 10000));
  const signedIn = req.header("sign-in-with-x") !== undefined;
  const answerId = randomUUID();
  emit({ handling: "/v2/siwx", answer_id: answerId, signed_in: signedIn, ms });
  await new Promise((resolve) => setTimeout(resolve, ms));
  siwxStats.handler_runs += 1;
  if (signedIn) siwxStats.handler_runs_signed_in += 1;
  res.json({ ...forecast(2), answer_id: answerId, signed_in: signedIn });
});

// Sync with the facilitator (GET /supported) and validate the v2 routes before saying ready.
try {
  await v2Http.initialize();
} catch (err) {
  fail(`cannot initialise against the facilitator at ${facilitatorUrl}: ${err instanceof Error ? err.message : err}`);
}

process.stdout.write(
  `${JSON.stringify({
    ready: "server",
    url: origin,
    pay_to: PAY_TO,
    asset,
    facilitator: facilitatorUrl,
    routes: ROUTES.map(({ method, path, x402_version, amount, scheme, pay_to }) => ({
      method, path, x402_version, amount, scheme: scheme ?? "exact", pay_to: pay_to ?? PAY_TO,
    })),
  })}\n`,
);
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
    setTimeout(() => process.exit(0), 1000).unref();
  });
}

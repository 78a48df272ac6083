//! Seeding the `payments` ledger directly, for tests that need rows the router would have
//! written (old, in some status, with recognisable fake secrets) without paying for them:
//! one builder instead of a hand-written INSERT in every test module.

use uuid::Uuid;

use super::TestDb;
use super::chain::{PAY_TO, ROUTER_ADDRESS};

/// A payment intent row. Defaults: an x402 v2 EVM `exact` intent of 10 000 on Base Sepolia's
/// USDC, paid to [`PAY_TO`] by the router's wallet, written now, a nonce and key of its own.
#[derive(Debug, Clone)]
pub struct Seed {
    pub id: Uuid,
    agent: Uuid,
    key: String,
    status: String,
    network: String,
    asset: String,
    amount: u64,
    pay_to: String,
    nonce: String,
    signed_authorization: String,
    header_value: String,
    error: Option<String>,
    /// SQL for `created_at` and `updated_at`.
    written: String,
    request_hash: String,
}

/// `text` as an SQL string literal.
fn lit(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl Seed {
    pub fn new(agent: Uuid, status: &str) -> Self {
        let id = Uuid::new_v4();
        let s = id.simple();
        Self {
            id,
            agent,
            key: format!("key-{s}"),
            status: status.to_owned(),
            network: "eip155:84532".into(),
            asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
            amount: 10_000,
            pay_to: PAY_TO.to_string(),
            nonce: format!("0x{s}{s}"),
            signed_authorization: "{}".into(),
            header_value: "h".into(),
            error: None,
            written: "now()".into(),
            request_hash: String::new(),
        }
    }

    pub fn key(self, key: &str) -> Self {
        Self { key: key.to_owned(), ..self }
    }
    pub fn asset(self, asset: &str) -> Self {
        Self { asset: asset.to_owned(), ..self }
    }
    pub fn network(self, network: &str) -> Self {
        Self { network: network.to_owned(), ..self }
    }
    pub fn pay_to(self, pay_to: &str) -> Self {
        Self { pay_to: pay_to.to_owned(), ..self }
    }
    pub fn nonce(self, nonce: &str) -> Self {
        Self { nonce: nonce.to_owned(), ..self }
    }
    pub fn amount(self, amount: u64) -> Self {
        Self { amount, ..self }
    }
    /// The stored `signed_authorization` (JSON text) and payment header.
    pub fn signed(self, authorization: &str, header_value: &str) -> Self {
        Self { signed_authorization: authorization.to_owned(), header_value: header_value.to_owned(), ..self }
    }
    pub fn error(self, error: Option<&str>) -> Self {
        Self { error: error.map(str::to_owned), ..self }
    }
    pub fn request_hash(self, hash: &str) -> Self {
        Self { request_hash: hash.to_owned(), ..self }
    }
    /// Written `interval` ago (an SQL interval, e.g. `2 hours`).
    pub fn ago(self, interval: &str) -> Self {
        Self { written: format!("now() - interval {}", lit(interval)), ..self }
    }
    /// Written at this SQL timestamp expression.
    pub fn written_at(self, sql: &str) -> Self {
        Self { written: sql.to_owned(), ..self }
    }

    /// The INSERT statement.
    pub fn sql(&self) -> String {
        format!(
            "INSERT INTO payments (id, agent_id, idempotency_key, x402_version, scheme, network, asset, amount, \
             pay_to, payer, nonce, valid_after, valid_before, requirement, context, signed_authorization, \
             header_name, header_value, status, error, created_at, updated_at, request_hash) VALUES \
             ('{id}', '{agent}', {key}, 2, 'exact', {network}, {asset}, {amount}, {pay_to}, '{payer}', {nonce}, 0, 1, \
              '{{}}', '{{}}', {auth}, 'PAYMENT-SIGNATURE', {header}, {status}, {error}, {written}, {written}, {hash})",
            id = self.id,
            agent = self.agent,
            key = lit(&self.key),
            network = lit(&self.network),
            asset = lit(&self.asset),
            amount = self.amount,
            pay_to = lit(&self.pay_to),
            payer = ROUTER_ADDRESS,
            nonce = lit(&self.nonce),
            auth = lit(&self.signed_authorization),
            header = lit(&self.header_value),
            status = lit(&self.status),
            error = self.error.as_deref().map_or_else(|| "NULL".to_owned(), lit),
            written = self.written,
            hash = lit(&self.request_hash),
        )
    }

    /// Inserts the row; its id.
    pub async fn insert(self, db: &TestDb) -> Uuid {
        super::exec(db, &self.sql()).await;
        self.id
    }
}

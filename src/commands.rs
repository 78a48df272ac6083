//! The sub-commands behind the CLI. Each returns an error for `main` to print as one line.

use anyhow::Context;
use serde_json::json;
use uuid::Uuid;

use crate::cli::{
    AgentsArgs, AgentsCommand, DatabaseArgs, GcArgs, McpArgs, OperatorsArgs, OperatorsCommand, ReceiptsArgs,
    ReceiptsCommand, ReconcileArgs, ServeArgs,
};
use crate::config::{self, Config, DatabaseConfig};
use crate::startup::{Application, Hooks};

/// `serve`: migrate (unless disabled) and run the HTTP service.
///
/// # Errors
/// Configuration, migration or server errors.
pub async fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let mut config = Config::from_args(args)?;
    // Kept until the server stops: dropping it flushes the traces not yet exported.
    let _traces = crate::telemetry::init_serving(config.json_logs)?;
    crate::startup::preflight(&mut config).await?;
    if config.run_migrations {
        let applied = crate::db::run_migrations(config.database.url.expose()).await.context("running migrations")?;
        if !applied.is_empty() {
            tracing::info!(migrations = ?applied, "applied migrations");
        }
    }
    let app = Application::build(config, Hooks::default())?;
    sweep_secrets(app.state()).await?;
    tracing::info!(port = app.port(), payer = %app.state().config.signer.address(), "x402-router listening");
    app.run_until_stopped().await?;
    Ok(())
}

/// Before serving: says which key seals (warning when it is the one derived from the wallet
/// key), and seals or redacts what earlier versions kept in the clear (`secrets::sweep`).
async fn sweep_secrets(state: &crate::state::AppState) -> anyhow::Result<()> {
    let secrets = &state.config.secrets;
    let keys: Vec<&str> = secrets.keyring.ids().collect();
    if secrets.keyring.current_id() == crate::secrets::DERIVED_KEY_ID {
        tracing::warn!(
            "SECRETS_KEY_FILE is not set: what agents forward is sealed with a key derived from the wallet key \
             (set SECRETS_KEY_FILE to keep it under a key of its own; docs/operations.md, \"Secrets at rest\")"
        );
    }
    let mut conn = state.pool.get().await.context("connecting to Postgres")?;
    let sweep = crate::secrets::sweep::Sweep {
        keyring: &secrets.keyring,
        redaction: &secrets.redaction,
        retention_hours: secrets.retention_hours,
        receipt_signer: &state.receipt_signer,
    };
    let swept = crate::secrets::sweep::run(&mut conn, &sweep).await.context("sealing the secrets of earlier rows")?;
    tracing::info!(secrets.keys = ?keys, secrets.sealing_key = secrets.keyring.current_id(), sealed = swept.sealed,
        dropped = swept.dropped, redacted_payments = swept.redacted_payments,
        redacted_receipts = swept.redacted_receipts, "secrets at rest: earlier rows swept");
    Ok(())
}

/// `migrate`: apply pending migrations.
///
/// # Errors
/// Configuration or migration errors.
pub async fn migrate(args: &DatabaseArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(args)?;
    let applied = crate::db::run_migrations(db.url.expose()).await?;
    println!("{}", json!({ "applied": applied }));
    Ok(())
}

/// `gc`: delete expired idempotency rows, then drop the secrets no payment can need any more
/// (`payments::kept::drop_secrets`); prints `{"deleted": N, "secrets_dropped": M}`.
///
/// # Errors
/// Configuration or database errors (non-zero exit).
pub async fn gc(args: &GcArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(&args.db)?;
    let batch: i64 = args
        .gc_batch_size
        .trim()
        .parse()
        .ok()
        .filter(|b| *b > 0)
        .context("invalid setting GC_BATCH_SIZE (--gc-batch-size): expected a positive integer")?;
    let rate: u64 = args.gc_max_rows_per_second.trim().parse().ok().context(
        "invalid setting GC_MAX_ROWS_PER_SECOND (--gc-max-rows-per-second): expected a non-negative integer",
    )?;
    let retention = config::secrets::retention_hours(&args.secrets_retention_hours)?;
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let deleted =
        crate::gc::run(&mut conn, batch, std::num::NonZeroU64::new(rate)).await.context("deleting expired rows")?;
    let dropped = crate::payments::kept::drop_secrets(&mut conn, retention, batch)
        .await
        .context("dropping the secrets of final or old payments")?;
    println!("{}", json!({ "deleted": deleted, "secrets_dropped": dropped }));
    Ok(())
}

/// `agents create|update|list|disable|enable|rotate-key`: the same calls, validation and
/// operator events (actor `cli`) as `/admin/agents`.
///
/// # Errors
/// Configuration, validation or database errors.
pub async fn agents(args: &AgentsArgs) -> anyhow::Result<()> {
    use crate::admin::{self, AgentChange};
    use crate::operators::Actor;
    let db = DatabaseConfig::from_args(&args.db)?;
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let actor = Actor::cli();
    let id_of = |id: &str| Uuid::parse_str(id).context("ID must be an agent uuid");
    match &args.command {
        AgentsCommand::Create { name, limits } => {
            let change = AgentChange::parse(&limits_json(Some(name), limits))?;
            let (agent, key, _) = admin::create_agent(&mut conn, &actor, admin::Rule::OFF, &change).await?;
            println!("{}", json!({ "agent_id": agent.spend.agent_id, "api_key": key, "agent": agent }));
        }
        AgentsCommand::Update { id, name, limits } => {
            let change = AgentChange::parse(&limits_json(name.as_deref(), limits))?;
            match admin::update_agent(&mut conn, &actor, admin::Rule::OFF, id_of(id)?, &change).await? {
                admin::Done::Applied(agent) => println!("{}", serde_json::to_string(&agent)?),
                admin::Done::Proposed(p) => println!("{}", serde_json::to_string(&p)?),
            }
        }
        AgentsCommand::List => {
            for a in admin::agents(&mut conn).await.context("listing agents")? {
                println!("{}", serde_json::to_string(&a)?);
            }
        }
        AgentsCommand::Disable { id } | AgentsCommand::Enable { id } => {
            let disabled = matches!(args.command, AgentsCommand::Disable { .. });
            let id = id_of(id)?;
            admin::set_disabled(&mut conn, &actor, admin::Rule::OFF, id, disabled).await?;
            println!("{}", json!({ "agent_id": id, "disabled": disabled }));
        }
        AgentsCommand::RotateKey { id } => {
            let (agent, key) = admin::rotate_key(&mut conn, &actor, id_of(id)?).await?;
            println!("{}", json!({ "agent_id": agent.spend.agent_id, "api_key": key }));
        }
    }
    Ok(())
}

/// The flags of `agents create|update` as the JSON body `/admin/agents` takes.
fn limits_json(name: Option<&str>, l: &crate::cli::AgentLimitArgs) -> serde_json::Value {
    use serde_json::Value;
    let none = |v: &str| v.trim().eq_ignore_ascii_case("none");
    let amount = |v: &str| if none(v) { Value::Null } else { Value::String(v.trim().to_owned()) };
    let list = |v: &str| {
        if none(v) {
            Value::Null
        } else {
            Value::Array(
                v.split(',').filter(|s| !s.trim().is_empty()).map(|s| Value::String(s.trim().into())).collect(),
            )
        }
    };
    // Not an integer: passed as a string, which the shared validation refuses by name.
    let rate = |v: &str| {
        if none(v) {
            Value::Null
        } else {
            v.trim().parse::<i64>().map_or_else(|_| Value::String(v.to_owned()), Value::from)
        }
    };
    let mut body = serde_json::Map::new();
    if let Some(n) = name {
        body.insert("name".into(), Value::String(n.to_owned()));
    }
    // `pattern=amount,…`; an entry without `=` is passed as is, which the shared validation refuses.
    let budgets = |v: &str| {
        if none(v) {
            return Value::Null;
        }
        let entries = v.split(',').filter(|s| !s.trim().is_empty());
        let pairs =
            entries.map(|e| e.split_once('=').map(|(h, a)| (h.trim().to_owned(), Value::String(a.trim().to_owned()))));
        pairs
            .collect::<Option<serde_json::Map<String, Value>>>()
            .map_or_else(|| Value::String(v.to_owned()), Value::Object)
    };
    type ToJson<'a> = &'a dyn Fn(&str) -> Value;
    let fields: [(&str, &Option<String>, ToJson); 12] = [
        ("max_per_call", &l.max_per_call, &amount),
        ("daily_budget", &l.daily_budget, &amount),
        ("month_budget", &l.month_budget, &amount),
        ("allowed_hosts", &l.allowed_hosts, &list),
        ("allowed_pay_to", &l.allowed_pay_to, &list),
        ("calls_per_minute", &l.calls_per_minute, &rate),
        ("payments_per_minute", &l.payments_per_minute, &rate),
        ("week_budget", &l.week_budget, &amount),
        ("lifetime_budget", &l.lifetime_budget, &amount),
        ("host_budgets", &l.host_budgets, &budgets),
        ("blocked_pay_to", &l.blocked_pay_to, &list),
        ("approval_above", &l.approval_above, &amount),
    ];
    for (field, value, to_json) in fields {
        if let Some(v) = value {
            body.insert(field.into(), to_json(v));
        }
    }
    Value::Object(body)
}

/// `operators create|list|revoke`: the same calls, validation and operator events (actor
/// `cli`) as `/admin/operators`. The command line has no bootstrap token: the last live admin
/// is not revoked (create another first).
///
/// # Errors
/// Configuration, validation or database errors.
pub async fn operators(args: &OperatorsArgs) -> anyhow::Result<()> {
    use crate::operators::Actor;
    use crate::operators::manage::{self, Bootstrap, NewOperator};
    let db = DatabaseConfig::from_args(&args.db)?;
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let actor = Actor::cli();
    match &args.command {
        OperatorsCommand::Create { name, role } => {
            let new = NewOperator::new(name, role.trim())?;
            let (created, token) = manage::create(&mut conn, &actor, &new).await.context("creating the operator")?;
            println!(
                "{}",
                json!({ "operator_id": created.id, "name": created.name, "role": created.role, "token": token })
            );
        }
        OperatorsCommand::List => {
            for o in manage::list(&mut conn).await.context("listing operators")? {
                println!("{}", serde_json::to_string(&o)?);
            }
        }
        OperatorsCommand::Revoke { id } => {
            let id = Uuid::parse_str(id.trim()).context("ID must be an operator uuid")?;
            let revoked = match manage::revoke(&mut conn, &actor, id, Bootstrap::Absent).await {
                Err(manage::OperatorError::NotFound) => anyhow::bail!("no operator {id}"),
                other => other?,
            };
            println!("{}", json!({ "operator_id": id, "revoked_at": revoked.revoked_at }));
        }
    }
    Ok(())
}

/// `reconcile`: re-check stale payment intents on-chain; prints one JSON line of counts.
///
/// # Errors
/// Configuration or database errors, or intents the chain could not answer for (after the
/// counts are printed), so that a scheduler notices.
pub async fn reconcile(args: &ReconcileArgs) -> anyhow::Result<()> {
    use crate::audit::reconcile;
    let db = DatabaseConfig::from_args(&args.db)?;
    let networks = config::parse_rpc_urls(&args.x402_rpc_urls)?;
    let solana_urls = config::solana::rpc_urls(&args.x402_rpc_urls)?;
    anyhow::ensure!(
        !networks.is_empty() || !solana_urls.is_empty(),
        "invalid setting X402_RPC_URLS (--x402-rpc-urls): is required: reconcile reads the chain"
    );
    let timeout = config::parse_ms("X402_RPC_TIMEOUT_MS", &args.x402_rpc_timeout_ms)?;
    // Logs from here on: a Solana network with one RPC URL is warned about as it is built.
    crate::telemetry::init(false);
    let solana = crate::solana::SolanaRpcs::new(&solana_urls, timeout).context("building the Solana RPC clients")?;
    let solana = (!solana.is_empty()).then(|| std::sync::Arc::new(solana));
    let older_than: u64 = config::parse_num("RECONCILE_OLDER_THAN_SECS", &args.older_than_secs)
        .map_err(|e| e.for_flag("older-than-secs"))?;
    let abandon_after = config::parse_ms("IDEMPOTENCY_ABANDON_AFTER_MS", &args.abandon_after_ms)
        .map_err(|e| e.for_flag("abandon-after-ms"))?;
    let settings = reconcile::Settings {
        older_than: std::time::Duration::from_secs(older_than),
        abandon_after,
        faults: None,
        only: None,
        solana,
    };
    let receipt_signer = config::load_signer(&args.key)?;
    let upstream_config = config::UpstreamConfig::from_args(&args.upstream)?;
    let max_payments: u64 = config::parse_num("RECONCILE_MAX_RECOVERIES", &args.max_recoveries)
        .map_err(|e| e.for_flag("max-recoveries"))?;
    let budget: u64 =
        config::parse_num("RECONCILE_RECOVERY_SECS", &args.recovery_secs).map_err(|e| e.for_flag("recovery-secs"))?;
    let upstream = crate::upstream::UpstreamClient::new(&upstream_config).context("building the upstream client")?;
    let keyring = receipt_signer
        .as_ref()
        .map(|signer| config::secrets::keyring(args.secrets.secrets_key_file.as_ref(), signer))
        .transpose()?;
    let recovering = receipt_signer.as_ref().zip(keyring.as_ref()).map(|(signer, keyring)| reconcile::Recovering {
        upstream: &upstream,
        receipt_signer: signer,
        keyring,
        max_payments,
        budget: std::time::Duration::from_secs(budget),
    });
    let chain = crate::x402::Chain::new(networks, timeout);
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let report = reconcile::run(&mut conn, &chain, &settings, recovering.as_ref())
        .await
        .context("reconciling payment intents")?;
    println!("{}", serde_json::to_string(&report)?);
    anyhow::ensure!(
        report.errors == 0,
        "{} payment intent(s) could not be checked on-chain (see the log); they were left as they were",
        report.errors
    );
    Ok(())
}

/// `wallet approve-permit2`: one ERC-20 `approve(Permit2, amount)` from the router's
/// wallet for a configured network and asset; prints one JSON line once it is mined.
///
/// # Errors
/// A missing or malformed setting, a network or asset the router does not pay with, or the
/// transaction failing (the RPC URL and the key are never printed).
pub async fn wallet(args: &crate::cli::WalletArgs) -> anyhow::Result<()> {
    let crate::cli::WalletCommand::ApprovePermit2(a) = &args.command;
    let rpc_urls = config::parse_rpc_urls(&a.x402_rpc_urls)?;
    let (assets, _, _) = config::configured_assets(&a.x402_assets, &rpc_urls)?;
    let signer = config::load_signer(&a.key)?.context("ROUTER_PRIVATE_KEY (or ROUTER_PRIVATE_KEY_FILE) is required")?;
    let timeout = config::parse_ms("X402_RPC_TIMEOUT_MS", &a.x402_rpc_timeout_ms)?;
    let wait: u64 = a.wait_secs.trim().parse().ok().filter(|w| *w > 0).context("--wait-secs: expected seconds > 0")?;
    let request = crate::approve::Request::parse(&a.network, &a.asset, &a.amount, &rpc_urls, &assets)?;
    crate::telemetry::init(false);
    let done = crate::approve::approve_permit2(&request, signer, timeout, std::time::Duration::from_secs(wait)).await?;
    println!("{}", serde_json::to_string(&done)?);
    Ok(())
}

/// `receipts verify FILE|-`: prints `valid: signed by 0x…` (exit 0) or `invalid: <reason>`
/// (exit 1); a file that cannot be read is `error: …` on stderr (exit 2).
pub fn receipts(args: &ReceiptsArgs) -> std::process::ExitCode {
    use std::io::Read;
    use std::process::ExitCode;
    let ReceiptsCommand::Verify { file } = &args.command;
    let text = if file == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(file)
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {file}: {e}");
            return ExitCode::from(2);
        }
    };
    match crate::audit::verify_receipt(&text) {
        Ok(signer) => {
            println!("valid: signed by {}", signer.to_checksum(None));
            ExitCode::SUCCESS
        }
        Err(reason) => {
            println!("invalid: {reason}");
            ExitCode::from(1)
        }
    }
}

/// `mcp`: the MCP tools on stdio for the router at `X402_ROUTER_URL`, as the agent of
/// `X402_ROUTER_AGENT_KEY`. Logs go to stderr (stdout is the protocol).
///
/// # Errors
/// A missing or malformed setting, or the MCP session failing.
pub async fn mcp(args: &McpArgs) -> anyhow::Result<()> {
    crate::telemetry::init(false);
    let mut base = url::Url::parse(&args.router_url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| anyhow::anyhow!("X402_ROUTER_URL must be an http(s) URL, got {:?}", args.router_url))?;
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    let key = args
        .agent_key
        .clone()
        .filter(|k| k.starts_with(crate::auth::KEY_PREFIX))
        .ok_or_else(|| anyhow::anyhow!("X402_ROUTER_AGENT_KEY must be set to an agent key (x4r_…)"))?;
    let wait = crate::config::parse_mcp_wait(&args.mcp_fetch_wait_seconds)?;
    crate::mcp::serve_stdio(base, key, wait).await
}

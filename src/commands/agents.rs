//! `agents create|update|list|disable|enable|rotate-key`: the control plane's agent calls from
//! the command line.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use uuid::Uuid;

use crate::config::{DatabaseArgs, DatabaseConfig};

#[derive(Debug, Args)]
pub struct AgentsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: AgentsCommand,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Create an agent and print `{"agent_id", "api_key", "agent"}` (the only time the key is shown).
    Create {
        /// A name for operators.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        limits: AgentLimitArgs,
    },
    /// Change an agent's name or limits (`none` removes a limit).
    Update {
        /// The agent's id.
        id: String,
        /// A new name.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        limits: AgentLimitArgs,
    },
    /// List agents with their limits and spend as JSON lines (never the keys).
    List,
    /// Disable an agent: its key is refused with 403 (by every router within 1 s).
    Disable {
        /// The agent's id.
        id: String,
    },
    /// Enable a disabled agent.
    Enable {
        /// The agent's id.
        id: String,
    },
    /// Give an agent a new key (printed once); the old one is refused within 1 s.
    RotateKey {
        /// The agent's id.
        id: String,
    },
}

/// An agent's limits on the command line; each as for `PATCH /admin/agents/{id}`, with
/// `none` for "no limit".
#[derive(Debug, Args)]
pub struct AgentLimitArgs {
    /// Most the agent may pay in one call, in the asset's atomic units, or `none`.
    #[arg(long)]
    pub max_per_call: Option<String>,
    /// Most the agent may pay in any rolling 24 hours, in atomic units, or `none`.
    #[arg(long)]
    pub daily_budget: Option<String>,
    /// Most the agent may pay in a calendar month (UTC), in atomic units, or `none`.
    #[arg(long)]
    pub month_budget: Option<String>,
    /// Upstream hosts the agent may call, comma-separated (`api.example.com`,
    /// `*.example.com`, either with `:port`), or `none` for any.
    #[arg(long)]
    pub allowed_hosts: Option<String>,
    /// `payTo` addresses the agent may pay, comma-separated, or `none` for any.
    #[arg(long)]
    pub allowed_pay_to: Option<String>,
    /// Calls per minute (paid or not), or `none`.
    #[arg(long)]
    pub calls_per_minute: Option<String>,
    /// Payments per minute, or `none`.
    #[arg(long)]
    pub payments_per_minute: Option<String>,
    /// Most the agent may pay in any rolling 7 days, in atomic units, or `none`.
    #[arg(long)]
    pub week_budget: Option<String>,
    /// Most the agent may ever pay, in atomic units, or `none`.
    #[arg(long)]
    pub lifetime_budget: Option<String>,
    /// Rolling 24 h budgets per upstream host, comma-separated `pattern=amount`
    /// (`api.example.com=50000,*.example.org=1000`), or `none`.
    #[arg(long)]
    pub host_budgets: Option<String>,
    /// `payTo` addresses the agent may never pay, comma-separated, or `none`.
    #[arg(long)]
    pub blocked_pay_to: Option<String>,
    /// A paid call above this price (atomic units) waits for an operator's approval, or `none`.
    #[arg(long)]
    pub approval_above: Option<String>,
}

/// `agents create|update|list|disable|enable|rotate-key`: the same calls, validation and
/// operator events (actor `cli`) as `/admin/agents`.
///
/// # Errors
/// Configuration, validation or database errors.
pub async fn run(args: &AgentsArgs) -> anyhow::Result<()> {
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
fn limits_json(name: Option<&str>, l: &AgentLimitArgs) -> serde_json::Value {
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

//! The limits an operator sets (docs/DESIGN.md §6): per agent a per-call cap, a rolling
//! 24 h budget, a calendar-month budget, a rolling 7-day and a lifetime budget, rolling 24 h
//! budgets per upstream host (`super::hosts`), allowlists of upstream hosts and of `payTo`
//! addresses, a `payTo` block list, and rate limits (calls and payments per minute);
//! wallet-wide a rolling 24 h cap across every agent, a `payTo` block list and a pause switch.
//!
//! Two places check them, both in Postgres so that every router process sees the same
//! answer:
//! * [`admit`], before a call claims its key: host allowlist, calls per minute, and a pause
//!   that includes unpaid calls. A refused call writes nothing (not even a rate window count).
//! * [`check_reservation`], inside the transaction that reserves a payment, under the agent's
//!   row lock (and, with a wallet cap, the settings row's lock): pause, caps, budgets, the
//!   `payTo` allowlist and block lists, and payments per minute. Concurrent payments therefore reserve one
//!   after another and can never exceed any limit together.

use diesel::sql_types::{Array, Bool, Integer, Nullable, Text, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::Spend;
use crate::db::PrepareExt;
use crate::money::Amount;

/// An allowlist entry an operator got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadEntry(pub String);

impl From<String> for BadEntry {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for BadEntry {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Why a payment or a call is refused by an operator's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Over a cap or budget (per call, 24 h, month, week, lifetime, host, wallet-wide): recorded as
    /// `payment_over_budget`.
    OverBudget(String),
    /// The `payTo` is blocked (wallet-wide or for the agent) or not on the agent's allowlist:
    /// recorded as `payment_not_allowed`.
    PayToNotAllowed(String),
    /// The upstream host is not on the agent's allowlist: 403 `upstream_not_allowed`,
    /// nothing written.
    HostNotAllowed(String),
    /// Payments (or, with `unpaid`, all calls) are paused: 503 `payments_paused`, nothing
    /// recorded for the call.
    Paused,
    /// Over a per-minute rate: 429 `rate_limited`, nothing recorded for the call.
    RateLimited { what: RateKind, retry_after: u32 },
    /// The agent was disabled (by an operator, after this call began): 403 `agent_disabled`,
    /// nothing signed or sent from then on, nothing recorded for the call.
    Disabled,
    /// The agent's key was rotated after this call authenticated with the old one: 401
    /// `unauthorized`; a call reserves nothing once its key is no longer the agent's.
    KeyRotated,
}

/// What a per-minute rate counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateKind {
    Call,
    Payment,
}

impl RateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::Payment => "payment",
        }
    }
}

/// The wallet-wide settings (`router_settings`).
#[derive(Debug, Clone, serde::Serialize, QueryableByName)]
pub struct Settings {
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    #[diesel(sql_type = Bool)]
    pub pause_unpaid: bool,
    /// Atomic units, decimal; None: no cap.
    #[diesel(sql_type = Nullable<Text>)]
    pub wallet_daily_cap: Option<String>,
    /// `payTo` addresses no agent may pay (None: none).
    #[diesel(sql_type = Nullable<Array<Text>>)]
    pub blocked_pay_to: Option<Vec<String>>,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Reads the settings; with `lock`, locks their row (`FOR NO KEY UPDATE`) so that the
/// wallet-wide sums read next see every earlier reservation under the cap.
///
/// # Errors
/// Database errors (also when the row is missing: migrations seed it).
pub async fn settings(conn: &mut AsyncPgConnection, lock: bool) -> QueryResult<Settings> {
    let sql = if lock {
        "SELECT paused, pause_unpaid, wallet_daily_cap::text AS wallet_daily_cap, blocked_pay_to, updated_at \
           FROM router_settings WHERE id FOR NO KEY UPDATE"
    } else {
        "SELECT paused, pause_unpaid, wallet_daily_cap::text AS wallet_daily_cap, blocked_pay_to, updated_at \
           FROM router_settings WHERE id"
    };
    diesel::sql_query(sql).prepared().get_result(conn).await
}

#[derive(QueryableByName)]
struct Used {
    #[diesel(sql_type = Text)]
    used: String,
}

/// What all agents together spent in the rolling 24 h window plus every authorization that
/// may still move money (the wallet-wide counterpart of an agent's `settled_24h +
/// reserved_24h`).
///
/// # Errors
/// Database errors.
pub async fn wallet_used_24h(conn: &mut AsyncPgConnection) -> QueryResult<String> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("SELECT {}::text AS used FROM payments p", super::usage::sum_where(&super::usage::in_day()))
    });
    let row: Used = diesel::sql_query(SQL.as_str()).prepared().get_result(conn).await?;
    Ok(row.used)
}

/// The sliding window of the per-minute rates.
pub const RATE_WINDOW_SECS: i32 = 60;

impl RateKind {
    /// The first key of the transaction-level advisory lock that serializes the counting of
    /// one agent's `kind` on every router.
    fn lock_class(self) -> i32 {
        match self {
            Self::Call => 0x0402_0001,
            Self::Payment => 0x0402_0002,
        }
    }
}

/// Counts one more `kind` for `agent_id` if fewer than `limit` were counted in the last
/// [`RATE_WINDOW_SECS`] (a sliding window: never more than `limit` in any 60 s, however the
/// calls fall across minute boundaries); `Some(seconds until one more fits)` if not (nothing
/// counted). Must run inside a transaction: an advisory lock per (agent, kind), held until it
/// ends, makes concurrent counts on any number of routers happen one after another, and the
/// count is read in a statement after the lock was granted (a fresh snapshot).
///
/// # Errors
/// Database errors.
pub async fn take_rate(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    kind: RateKind,
    limit: i32,
) -> QueryResult<Option<u32>> {
    diesel::sql_query("SELECT pg_advisory_xact_lock($1, hashtext($2::text))")
        .bind::<Integer, _>(kind.lock_class())
        .bind::<SqlUuid, _>(agent_id)
        .prepared()
        .execute(conn)
        .await?;
    #[derive(QueryableByName)]
    struct Taken {
        #[diesel(sql_type = Bool)]
        taken: bool,
        #[diesel(sql_type = Integer)]
        secs: i32,
    }
    // The `limit` most recent events of the window; full: the oldest of them leaves it first.
    let taken: Taken = diesel::sql_query(
        "WITH recent AS ( \
              SELECT at FROM agent_rate_events \
               WHERE agent_id = $1 AND kind = $2 AND at > clock_timestamp() - make_interval(secs => $4) \
               ORDER BY at DESC LIMIT $3), \
              counted AS (SELECT count(*) AS n, min(at) AS oldest FROM recent), \
              ins AS (INSERT INTO agent_rate_events (agent_id, kind, at) \
                      SELECT $1, $2, clock_timestamp() FROM counted WHERE n < $3 RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM ins) AS taken, \
                GREATEST(1, COALESCE(CEIL(EXTRACT(EPOCH FROM oldest + make_interval(secs => $4) - clock_timestamp())), 1))::int AS secs \
           FROM counted",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(kind.as_str())
    .bind::<Integer, _>(limit)
    .bind::<Integer, _>(RATE_WINDOW_SECS)
    .prepared()
    .get_result(conn)
    .await?;
    Ok((!taken.taken).then(|| u32::try_from(taken.secs).unwrap_or(60)))
}

/// Deletes counted calls and payments that left the sliding window (run by `gc`); returns how
/// many.
///
/// # Errors
/// Database errors.
pub async fn delete_old_rate_events(conn: &mut AsyncPgConnection) -> QueryResult<usize> {
    diesel::sql_query("DELETE FROM agent_rate_events WHERE at < now() - make_interval(secs => $1)")
        .bind::<Integer, _>(RATE_WINDOW_SECS * 2)
        .execute(conn)
        .await
}

/// Why a payment of `amount` to `pay_to` may not be reserved for `spend` (the agent's limits
/// and usage, read under its lock), if it may not. Unreadable limits refuse.
pub fn agent_refusal(spend: &Spend, amount: Amount, pay_to: &str) -> Option<Refusal> {
    let Ok(limits) = spend.limits() else {
        return Some(Refusal::OverBudget("the agent's limits cannot be read; refusing to pay".into()));
    };
    if let Some(why) = limits.exceeded_by(amount) {
        return Some(Refusal::OverBudget(why));
    }
    pay_to_refusal(spend, pay_to).map(Refusal::PayToNotAllowed)
}

/// Why `spend`'s agent may not pay `pay_to`, if it may not: blocked wallet-wide or for the
/// agent (a block list wins over the allowlist), or not on the agent's allowlist. The one
/// check of a `payTo`, at the choice of what to sign and again in the reservation.
pub fn pay_to_refusal(spend: &Spend, pay_to: &str) -> Option<String> {
    let on = |list: &Option<Vec<String>>| list.as_ref().is_some_and(|l| l.iter().any(|a| pay_to_matches(a, pay_to)));
    if on(&spend.wallet_blocked_pay_to) {
        Some(format!("the payTo {pay_to} is on the wallet-wide block list"))
    } else if on(&spend.blocked_pay_to) {
        Some(format!("the payTo {pay_to} is on the agent's block list"))
    } else if spend.allowed_pay_to.is_some() && !on(&spend.allowed_pay_to) {
        Some(format!("the payTo {pay_to} is not on the agent's allowlist"))
    } else {
        None
    }
}

/// Every limit of a reservation, in the reserving transaction, after `spend` was read under
/// the agent's lock: pause, the agent's limits, the wallet-wide cap (under the settings row's
/// lock) and, last, payments per minute (counted only for a payment that passes the rest).
/// `draw` is what the reservation takes from the wallet, for the wallet-wide cap.
///
/// # Errors
/// Database errors.
pub async fn check_reservation(
    conn: &mut AsyncPgConnection,
    spend: &Spend,
    amount: Amount,
    pay_to: &str,
    draw: WalletDraw,
) -> QueryResult<Option<Refusal>> {
    let found = settings(conn, false).await?;
    if found.paused {
        return Ok(Some(Refusal::Paused));
    }
    if let Some(refusal) = agent_refusal(spend, amount, pay_to) {
        return Ok(Some(refusal));
    }
    if found.wallet_daily_cap.is_some() {
        // Re-read under the lock, in a statement of its own (a fresh snapshot): reservations
        // of every agent pass here one at a time while a cap is set.
        let locked = settings(conn, true).await?;
        if locked.paused {
            return Ok(Some(Refusal::Paused));
        }
        if let Some(cap) = locked.wallet_daily_cap.as_deref()
            && let Some(refusal) = over_wallet_cap(conn, cap, amount, draw).await?
        {
            return Ok(Some(refusal));
        }
    }
    if let Some(limit) = spend.payments_per_minute
        && let Some(retry_after) = take_rate(conn, spend.agent_id, RateKind::Payment, limit).await?
    {
        return Ok(Some(Refusal::RateLimited { what: RateKind::Payment, retry_after }));
    }
    Ok(None)
}

/// What a reservation takes from the wallet, as the wallet-wide cap counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalletDraw {
    /// The payment's price leaves the wallet (`exact`, `upto`, Solana).
    Price,
    /// A batch-settlement voucher: it draws on its channel's deposit, which the cap counted
    /// when it was locked; only a deposit signed with it (zero: none) leaves the wallet now.
    Deposit(Amount),
}

/// What remains of the wallet-wide cap: the cap less the rolling 24 h of payments and the
/// money locked in channels (`None`: no cap).
///
/// # Errors
/// Database errors; a stored amount that does not read.
pub async fn wallet_left(conn: &mut AsyncPgConnection, cap: Option<&str>) -> QueryResult<Option<(Amount, Amount)>> {
    let Some(cap) = cap else { return Ok(None) };
    let bad = |e: crate::money::BadAmount| diesel::result::Error::DeserializationError(Box::new(e));
    let cap = Amount::parse(cap).map_err(bad)?;
    let used = Amount::parse(&wallet_used_24h(conn).await?).map_err(bad)?;
    let in_channels = super::lanes::locked(conn).await?;
    let left = cap.as_u256().saturating_sub(used.as_u256()).saturating_sub(in_channels.as_u256());
    Ok(Some((Amount::from_u256(left), in_channels)))
}

/// The wallet-wide cap's verdict on a reservation of `amount` drawing `draw` from the wallet.
async fn over_wallet_cap(
    conn: &mut AsyncPgConnection,
    cap: &str,
    amount: Amount,
    draw: WalletDraw,
) -> QueryResult<Option<Refusal>> {
    let Ok(Some((left, in_channels))) = wallet_left(conn, Some(cap)).await else {
        return Ok(Some(Refusal::OverBudget("the wallet's daily cap cannot be read; refusing to pay".into())));
    };
    let why = match draw {
        WalletDraw::Price if amount > left => format!(
            "the price {amount} exceeds what remains of the wallet-wide daily cap ({left}, after {in_channels} \
             locked in payment channels)"
        ),
        WalletDraw::Deposit(deposit) if deposit > left => format!(
            "the channel's deposit of {deposit} exceeds what remains of the wallet-wide daily cap ({left}, after \
             {in_channels} locked in payment channels); nothing was signed"
        ),
        WalletDraw::Price | WalletDraw::Deposit(_) => return Ok(None),
    };
    Ok(Some(Refusal::OverBudget(why)))
}

/// What [`before_leaving`] found: whether anything signed may leave the router now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leaving {
    /// The caller still owns the key, payments are not paused and the agent is enabled.
    Clear,
    /// The caller no longer owns the in-flight key (taken over, or finished by another).
    Superseded,
    /// Stopped by an operator: payments paused, or the agent disabled (or gone).
    Stopped(Refusal),
}

/// The one check before anything signed leaves the router for an upstream (a payment header,
/// new or recorded earlier, or a sign-in): the key's lease (under its row lock, so a takeover
/// being committed is waited for and seen), the pause and the agent's `disabled` flag, read in
/// one statement immediately before sending. The row lock is all it writes and ends with it:
/// its commit does not wait for the WAL flush (a crash loses nothing by it).
///
/// # Errors
/// Database errors.
pub async fn before_leaving(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    lease: Uuid,
) -> QueryResult<Leaving> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = Bool)]
        paused: bool,
        #[diesel(sql_type = Nullable<Bool>)]
        disabled: Option<bool>,
    }
    let found: Option<Found> = diesel::sql_query(
        "SELECT set_config('synchronous_commit', 'off', true) AS sync, s.paused, \
                (SELECT a.disabled FROM agents a WHERE a.id = k.agent_id) AS disabled \
           FROM idempotency_keys k, router_settings s \
          WHERE k.agent_id = $1 AND k.key = $2 AND k.lease = $3 AND k.status = 'in_flight' AND s.id \
            FOR NO KEY UPDATE OF k",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .bind::<SqlUuid, _>(lease)
    .prepared()
    .get_result(conn)
    .await
    .optional()?;
    Ok(match found {
        None => Leaving::Superseded,
        Some(Found { paused: true, .. }) => Leaving::Stopped(Refusal::Paused),
        Some(Found { disabled: Some(false), .. }) => Leaving::Clear,
        Some(_) => Leaving::Stopped(Refusal::Disabled),
    })
}

/// What [`admit`] reads.
#[derive(Debug, QueryableByName)]
struct Gate {
    #[diesel(sql_type = Nullable<Array<Text>>)]
    allowed_hosts: Option<Vec<String>>,
    #[diesel(sql_type = Nullable<Integer>)]
    calls_per_minute: Option<i32>,
    #[diesel(sql_type = Bool)]
    pause_unpaid: bool,
}

/// SQL: true when the agent `$1` has a gate that [`admit`] must check before a call starts
/// (a host allowlist, a calls-per-minute limit, or a pause that includes unpaid calls).
/// Without one, [`admit`] admits every call and writes nothing, so the idempotency claim
/// reads this in its own statement and claims at once (`idempotency::store::claim`).
macro_rules! call_gate_sql {
    () => {
        "EXISTS (SELECT 1 FROM agents a, router_settings s WHERE a.id = $1 AND s.id \
           AND (a.allowed_hosts IS NOT NULL OR a.calls_per_minute IS NOT NULL OR (s.paused AND s.pause_unpaid)))"
    };
}
pub(crate) use call_gate_sql;

/// Whether `agent_id` may start a call to `host` (lowercase, with its port when the URL
/// names one) now: host allowlist, a pause that includes unpaid calls, calls per minute (the
/// call is counted when admitted). `Ok(None)`: admitted (also for an unknown agent, which
/// authentication refuses anyway).
///
/// # Errors
/// Database errors.
pub async fn admit(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    host: &str,
    port: Option<u16>,
) -> QueryResult<Option<Refusal>> {
    let gate: Option<Gate> = diesel::sql_query(
        "SELECT a.allowed_hosts, a.calls_per_minute, (s.paused AND s.pause_unpaid) AS pause_unpaid \
           FROM agents a, router_settings s WHERE a.id = $1 AND s.id",
    )
    .bind::<SqlUuid, _>(agent_id)
    .prepared()
    .get_result(conn)
    .await
    .optional()?;
    let Some(gate) = gate else { return Ok(None) };
    if gate.pause_unpaid {
        return Ok(Some(Refusal::Paused));
    }
    if let Some(allowed) = &gate.allowed_hosts
        && !allowed.iter().any(|pattern| host_matches(pattern, host, port))
    {
        let shown = port.map_or_else(|| host.to_owned(), |p| format!("{host}:{p}"));
        return Ok(Some(Refusal::HostNotAllowed(format!(
            "the upstream host {shown} is not on this agent's allowlist"
        ))));
    }
    if let Some(limit) = gate.calls_per_minute {
        use diesel_async::AsyncConnection;
        let counted = conn
            .transaction::<_, diesel::result::Error, _>(async |c| take_rate(c, agent_id, RateKind::Call, limit).await)
            .await?;
        if let Some(retry_after) = counted {
            return Ok(Some(Refusal::RateLimited { what: RateKind::Call, retry_after }));
        }
    }
    Ok(None)
}

/// Whether an allowlist entry matches a host: `api.example.com` exactly, `*.example.com` any
/// host below `example.com` (not `example.com` itself), each optionally with `:port`, which
/// must then be the URL's port (without one, any port). Hosts compare case-insensitively.
pub fn host_matches(pattern: &str, host: &str, port: Option<u16>) -> bool {
    let (name, want_port) = match pattern.rsplit_once(':') {
        // An IPv6 literal keeps its colons inside brackets.
        Some((n, p)) if !p.contains(']') && p.chars().all(|c| c.is_ascii_digit()) => (n, p.parse::<u16>().ok()),
        _ => (pattern, None),
    };
    if want_port.is_some() && want_port != port {
        return false;
    }
    let host = host.trim_end_matches('.');
    match name.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        }
        None => name.eq_ignore_ascii_case(host),
    }
}

/// Checks an allowlist entry given by an operator: a host name (letters, digits, `-`, `.`),
/// an IPv4 literal or a bracketed IPv6 literal, optionally `*.`-prefixed (names only) and
/// `:port`-suffixed. Returns the entry lowercased.
///
/// # Errors
/// A sentence naming what is wrong.
pub fn parse_host_pattern(raw: &str) -> Result<String, BadEntry> {
    let entry = raw.trim().to_ascii_lowercase();
    let bad = || BadEntry(format!("{raw:?} is not a host, `*.domain` or either with `:port`"));
    if entry.is_empty() || entry.len() > 260 {
        return Err(bad());
    }
    let (name, port) = match entry.rsplit_once(':') {
        Some((n, p)) if !p.contains(']') => (n, Some(p)),
        _ => (entry.as_str(), None),
    };
    if let Some(p) = port
        && p.parse::<u16>().ok().filter(|p| *p > 0).is_none()
    {
        return Err(bad());
    }
    if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return v6.parse::<std::net::Ipv6Addr>().map(|_| entry.clone()).map_err(|_| bad());
    }
    let labels = name.strip_prefix("*.").unwrap_or(name);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if labels.split('.').all(label_ok) { Ok(entry) } else { Err(bad()) }
}

/// Checks a `payTo` allowlist entry: an EVM address (`0x` + 40 hex digits). Returns it
/// lowercased.
///
/// # Errors
/// A sentence naming what is wrong.
pub fn parse_pay_to(raw: &str) -> Result<String, BadEntry> {
    let entry = raw.trim();
    let hex = entry.strip_prefix("0x").or_else(|| entry.strip_prefix("0X"));
    match hex {
        Some(h) if h.len() == 40 && h.chars().all(|c| c.is_ascii_hexdigit()) => Ok(entry.to_ascii_lowercase()),
        // A Solana address: base58 is case-sensitive, kept as written.
        None if (32..=44).contains(&entry.len()) && entry.bytes().all(is_base58) => Ok(entry.to_owned()),
        _ => Err(BadEntry(format!(
            "{raw:?} is not an address (0x followed by 40 hex digits, or a base58 Solana address)"
        ))),
    }
}

/// A character of the base58 alphabet (no `0`, `O`, `I`, `l`).
fn is_base58(b: u8) -> bool {
    b.is_ascii_alphanumeric() && !b"0OIl".contains(&b)
}

/// True when the allowlist entry `entry` (as [`parse_pay_to`] stores it) names `pay_to`: an EVM
/// address whatever its case, a Solana address only exactly (base58 is case-sensitive: two
/// spellings that differ in case are two accounts).
pub fn pay_to_matches(entry: &str, pay_to: &str) -> bool {
    if entry.starts_with("0x") { entry.eq_ignore_ascii_case(pay_to) } else { entry == pay_to }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solana_pay_to_entries_match_only_exactly() {
        let sol = "EmPfs5hbdp1FsvxQjan7TaNCp2KWZSQ79U8tX2zLKoTn";
        let entry = parse_pay_to(&format!(" {sol} ")).unwrap();
        assert!(pay_to_matches(&entry, sol));
        assert!(!pay_to_matches(&entry, &sol.to_ascii_lowercase()));
        assert!(!pay_to_matches(&entry, "emPfs5hbdp1FsvxQjan7TaNCp2KWZSQ79U8tX2zLKoTn"));
        let evm = parse_pay_to("0x00000000000000000000000000000000000000AA").unwrap();
        assert!(pay_to_matches(&evm, "0x00000000000000000000000000000000000000aA"));
        for bad in ["0x12", "not-an-address", "0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl", &"1".repeat(60)] {
            assert!(parse_pay_to(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_patterns_match_exactly_what_they_say() {
        assert!(host_matches("api.example.com", "API.example.com", None));
        assert!(host_matches("api.example.com", "api.example.com", Some(8443)));
        assert!(!host_matches("api.example.com", "evil-api.example.com", None));
        assert!(!host_matches("api.example.com", "api.example.com.evil.net", None));
        assert!(host_matches("*.example.com", "a.example.com", None));
        assert!(host_matches("*.example.com", "a.b.example.com", None));
        assert!(!host_matches("*.example.com", "example.com", None));
        assert!(!host_matches("*.example.com", "badexample.com", None));
        assert!(!host_matches("*.example.com", "a.example.com.evil.net", None));
        assert!(host_matches("127.0.0.1:8080", "127.0.0.1", Some(8080)));
        assert!(!host_matches("127.0.0.1:8080", "127.0.0.1", Some(8081)));
        assert!(!host_matches("127.0.0.1:8080", "127.0.0.1", None));
        assert!(host_matches("[::1]", "[::1]", Some(1)));
    }

    #[test]
    fn operators_entries_are_checked() {
        assert_eq!(parse_host_pattern(" API.Example.com ").as_deref(), Ok("api.example.com"));
        assert_eq!(parse_host_pattern("*.example.com:443").as_deref(), Ok("*.example.com:443"));
        assert_eq!(parse_host_pattern("[::1]:8080").as_deref(), Ok("[::1]:8080"));
        for bad in ["", "*", "*.", "a..b", "-a.com", "a.com:0", "a.com:99999", "a b.com", "ex*.com", "a.com/x", "[zz]"]
        {
            assert!(parse_host_pattern(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_pay_to("0x00000000000000000000000000000000000000Ab").is_ok());
        for bad in ["0x123", "00000000000000000000000000000000000000000a", "0xzz00000000000000000000000000000000000000"]
        {
            assert!(parse_pay_to(bad).is_err(), "{bad:?} accepted");
        }
    }
}

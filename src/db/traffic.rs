//! What the router's connections send Postgres, counted: statements (the transaction-control
//! ones apart) and transactions, per pool, as `x402_router_db_statements_total{pool, kind}`
//! and `x402_router_db_transactions_total{pool}` (`metrics`). This is how the suite holds a
//! call kind to its statement budget (tests/api/statements.rs) and how an operator sees what
//! each call costs, without `pg_stat_statements`.
//!
//! Counted from diesel's instrumentation events of each connection: every statement sent
//! (`StartQuery`, also for pipelined ones); `BEGIN`, `COMMIT`, `ROLLBACK` and savepoints are
//! the statements that follow a transaction event, counted as `kind="control"`; a
//! transaction is a top-level `BEGIN`, or a statement sent outside one (Postgres runs it as
//! a transaction of its own).

use diesel::connection::InstrumentationEvent;
use prometheus::IntCounter;

/// The counters of one pool (cheap to clone: the counters are shared).
#[derive(Clone, Debug)]
pub struct Traffic {
    /// Statements other than transaction control.
    pub queries: IntCounter,
    /// `BEGIN`, `COMMIT`, `ROLLBACK`, `SAVEPOINT`, `RELEASE`.
    pub control: IntCounter,
    pub transactions: IntCounter,
}

/// One connection's position, for telling control statements and transactions apart.
#[derive(Debug, Default)]
pub(super) struct TrafficWatch {
    traffic: Option<Traffic>,
    /// Inside an explicit transaction (depth ≥ 1).
    in_transaction: bool,
    /// The next statement is the control statement of a transaction event.
    control_next: bool,
    /// That control statement ends the top-level transaction.
    closing: bool,
}

impl TrafficWatch {
    pub(super) fn new(traffic: Option<Traffic>) -> Self {
        Self { traffic, ..Self::default() }
    }

    pub(super) fn on_event(&mut self, event: &InstrumentationEvent<'_>) {
        let Some(traffic) = &self.traffic else { return };
        match event {
            InstrumentationEvent::BeginTransaction { depth, .. } => {
                if depth.get() == 1 {
                    traffic.transactions.inc();
                    self.in_transaction = true;
                }
                self.control_next = true;
            }
            InstrumentationEvent::CommitTransaction { depth, .. }
            | InstrumentationEvent::RollbackTransaction { depth, .. } => {
                self.control_next = true;
                self.closing = depth.get() == 1;
            }
            InstrumentationEvent::StartQuery { .. } => {
                if std::mem::take(&mut self.control_next) {
                    traffic.control.inc();
                    if std::mem::take(&mut self.closing) {
                        self.in_transaction = false;
                    }
                } else {
                    traffic.queries.inc();
                    if !self.in_transaction {
                        traffic.transactions.inc();
                    }
                }
            }
            _ => {}
        }
    }
}

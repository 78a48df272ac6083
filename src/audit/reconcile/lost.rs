//! The second pass of a run: recovering the answers of `settled_response_lost` payments
//! (see the parent module's rules), each recorded in one transaction with its receipt.

use super::*;
use crate::relay::pay::scheme::Chains;

#[derive(Debug, QueryableByName)]
struct LostRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    agent_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

/// One batch of `settled_response_lost` payments recovery may look at: in the window, with
/// no recovery record or a lost one, and no key in flight (a takeover's business).
async fn lost_answers(conn: &mut AsyncPgConnection, after: Option<Cursor>) -> QueryResult<Vec<LostRow>> {
    diesel::sql_query(
        "SELECT p.id, p.agent_id, p.created_at FROM payments p \
          WHERE p.status = 'settled_response_lost' \
            AND p.created_at > now() - make_interval(hours => $1::int) \
            AND (p.recovery IS NULL OR p.recovery->>'outcome' = 'lost') \
            AND p.updated_at <= now() \
            AND NOT EXISTS (SELECT 1 FROM idempotency_keys k \
                 WHERE k.agent_id = p.agent_id AND k.key = p.idempotency_key AND k.status = 'in_flight') \
            AND ($2::timestamptz IS NULL OR (p.created_at, p.id) > ($2, $3::uuid)) \
          ORDER BY p.created_at, p.id \
          LIMIT $4",
    )
    .bind::<Integer, _>(i32::try_from(RECOVERY_WINDOW_HOURS).unwrap_or(24))
    .bind::<Nullable<Timestamptz>, _>(after.map(|c| c.created_at))
    .bind::<Nullable<SqlUuid>, _>(after.map(|c| c.id))
    .bind::<BigInt, _>(BATCH)
    .load(conn)
    .await
}

/// The attempts recorded so far when `row` may be tried (again), else `None`: see the
/// module's rules.
fn eligible(row: &PaymentRow) -> Option<Vec<RecoveryStep>> {
    if row.status != SettledResponseLost {
        return None;
    }
    let Some(rec) = &row.recovery else {
        return Some(Vec::new());
    };
    if rec.get("outcome").and_then(Value::as_str) != Some(RecoveryKind::Lost.as_str()) {
        return None;
    }
    let attempts = RecoveryStep::stored(Some(rec));
    let rounds = attempts.iter().filter(|a| matches!(a, RecoveryStep::Round { .. })).count();
    (rounds < MAX_ROUNDS && recovery::worth_retrying(&attempts)).then_some(attempts)
}

/// The second pass: tries to get back the lost answers it may, within the run's bounds.
pub(super) async fn recover_lost(
    conn: &mut AsyncPgConnection,
    chains: &Chains<'_>,
    r: &Recovering<'_>,
    report: &mut Report,
) -> QueryResult<()> {
    let run_deadline = Instant::now() + r.budget;
    let mut tried = 0u64;
    let mut after = None;
    loop {
        let batch = lost_answers(conn, after).await?;
        let Some(last) = batch.last() else {
            return Ok(());
        };
        after = Some(Cursor { created_at: last.created_at, id: last.id });
        for lost in &batch {
            let row: Option<PaymentRow> = payments_table::table
                .find((lost.agent_id, lost.id))
                .select(PaymentRow::as_select())
                .first(conn)
                .await
                .optional()?;
            let Some(row) = row else { continue };
            let Some(earlier) = eligible(&row) else { continue };
            // Only payments that can be re-sent count toward the bounds: the others are
            // recorded (nothing to try) without reaching any upstream.
            let sends = recovery::can_resend(&row);
            if sends && (tried >= r.max_payments || Instant::now() >= run_deadline) {
                report.recovery_deferred += 1;
                continue;
            }
            tried += u64::from(sends);
            // A lease: two runs at once never re-send the same payment; the claimed value
            // guards the final write.
            let Some(claimed) =
                payments::store::lease_lost_answer(conn, row.agent_id, row.id, row.updated_at, millis(LEASE)).await?
            else {
                tracing::info!(payment.id = %row.id, "lost answer taken by another run meanwhile");
                continue;
            };
            let deadline = run_deadline.min(Instant::now() + PER_PAYMENT);
            let opened = crate::secrets::intent::open(r.keyring, &row);
            let attempt = crate::relay::pay::registry::recover(chains, r.upstream, (&row, &opened), deadline)
                .await
                .unwrap_or_else(recovery::Recovery::skipped);
            report.resends += u64::from(attempt.sends);
            let kind = attempt.kind();
            let mut log = earlier;
            log.push(RecoveryStep::Round { by: "reconcile".into(), at: Utc::now().to_rfc3339() });
            log.extend(attempt.log);
            let note = payments::RecoveryNote { kind, log }.to_json();
            let answer = match attempt.ending {
                Ending::Recovered { resp, tx_hash } => Some((resp, tx_hash)),
                Ending::Lost => None,
            };
            let written = record(conn, r.receipt_signer, &row, claimed, kind, &note, answer).await?;
            if !written {
                tracing::info!(payment.id = %row.id, "lost answer changed meanwhile; nothing recorded");
                continue;
            }
            tracing::info!(payment.id = %row.id, agent_id = %row.agent_id, recovery = kind.as_str(),
                sends = attempt.sends, "recovery of a lost answer recorded");
            match kind {
                RecoveryKind::Recovered => report.recovered += 1,
                RecoveryKind::Reaccessed => report.reaccessed += 1,
                RecoveryKind::Lost => report.recovery_lost += 1,
            }
        }
        if (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}

/// Why a recovery could not be recorded.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    /// The payment or its key changed since the claim (or the key is in flight).
    #[error("changed meanwhile")]
    Changed,
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
}

/// Records what recovery came to for `row`, in one transaction guarded by the claim and by
/// a share lock on the key's idempotency row (none in flight): the recovery record and, for
/// an answer, the payment `settled` with the proven transaction, a signed receipt that says
/// how it was obtained, and the answer as `/route` would have given it. `false`: nothing
/// written (changed meanwhile).
async fn record(
    conn: &mut AsyncPgConnection,
    signer: &PrivateKeySigner,
    row: &PaymentRow,
    claimed: DateTime<Utc>,
    kind: RecoveryKind,
    note: &Value,
    answer: Option<(UpstreamResponse, String)>,
) -> QueryResult<bool> {
    let tx_hash = answer.as_ref().map(|(_, tx)| tx.clone());
    let status = if answer.is_some() { Settled } else { SettledResponseLost };
    // Rendered before the transaction: the receipt is signed once.
    let rendered = match &answer {
        Some((resp, _)) => match render(signer, row, kind, resp, tx_hash.as_deref()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(payment.id = %row.id, error = %e, "a recovered answer cannot be recorded");
                return Ok(false);
            }
        },
        None => None,
    };
    let result = conn
        .transaction::<_, RecordError, _>(async |c| {
            if !payments::store::record_recovery(c, row, claimed, status, tx_hash.as_deref(), note).await? {
                return Err(RecordError::Changed);
            }
            if let Some((receipt, http_status, body)) = &rendered {
                crate::receipts::store::insert(c, receipt).await?;
                diesel::sql_query(
                    "INSERT INTO recovered_answers (agent_id, payment_id, kind, receipt_id, http_status, body) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind::<SqlUuid, _>(row.agent_id)
                .bind::<SqlUuid, _>(row.id)
                .bind::<Text, _>(kind.as_str())
                .bind::<SqlUuid, _>(receipt.id)
                .bind::<Integer, _>(i32::from(*http_status))
                .bind::<Bytea, _>(body)
                .execute(c)
                .await?;
            }
            Ok(())
        })
        .await;
    match result {
        Ok(()) => Ok(true),
        Err(RecordError::Changed) => Ok(false),
        Err(RecordError::Db(e)) => Err(e),
    }
}

/// The receipt and the `/route` answer (status, envelope bytes) of an answer recovery got.
fn render(
    signer: &PrivateKeySigner,
    row: &PaymentRow,
    kind: RecoveryKind,
    resp: &UpstreamResponse,
    tx_hash: Option<&str>,
) -> Result<(crate::receipts::Receipt, u16, Vec<u8>), Unreadable> {
    use crate::idempotency::canonical;
    let shown = crate::relay::pay::registry::view_of_row(row, Settled, tx_hash)
        .map_err(|e| Unreadable(e.to_string()))?
        .recovery(Some(kind));
    let receipt_id = Uuid::new_v4();
    let (outcome, http_status, body) = crate::relay::outcome::answered(resp, Some(&shown), receipt_id);
    let draft = crate::receipts::Draft {
        id: receipt_id,
        agent_id: row.agent_id,
        idempotency_key: row.idempotency_key.clone(),
        request_hash: row.request_hash.clone(),
        method: row.request_method.clone().unwrap_or_default(),
        url: row.request_url.clone().unwrap_or_default(),
        upstream_status: Some(i32::from(resp.status)),
        upstream_body_sha256: canonical::sha256_hex(&resp.body),
        payment: Some(shown.to_value()),
        outcome: outcome.as_str().to_owned(),
        trace_id: crate::telemetry::current_trace_id(),
    };
    let receipt = draft.sign(signer).map_err(|e| format!("signing the receipt: {e}"))?;
    Ok((receipt, http_status, body))
}

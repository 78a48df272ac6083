//! Budgets across assets of different decimals (issue 42, item 5): with a budget currency,
//! USDC (6 decimals) and an 18-decimal stablecoin share one budget exactly, each payment
//! counted at its asset's value and rounded up against the spender. Raced for real, counted
//! on-chain in each token.

use std::sync::Arc;

use alloy::primitives::U256;
use futures_util::future::join_all;
use proptest::prelude::*;
use serde_json::{Value, json};
use x402_router::money::{Amount, Rate};

use crate::helpers::*;

/// 0.01 of the 18-decimal token: the same value as `PRICE` of USDC.
fn price18() -> U256 {
    U256::from(10u64).pow(U256::from(16u8))
}

/// A router paying USDC and the 18-decimal token on `chain`, budgets counted in USD of 6
/// decimals, both tokens worth 1.
async fn budget_app(chain: &Devnet) -> TestApp {
    let network = format!("eip155:{}", chain.chain_id);
    let (usdc, t18) = (chain.token, chain.token18);
    let mut extra: Vec<(String, String)> =
        chain.router_extra().into_iter().filter(|(k, _)| k != "x402-assets").collect();
    extra.push(("x402-assets".into(), format!("{network}={usdc}@6,{network}={t18}@18")));
    extra.push(("budget-currency".into(), "USD".into()));
    extra.push(("x402-asset-values".into(), format!("{network}={usdc}=1,{network}={t18}=1")));
    spawn_app_with(AppOptions { acquire_timeout_ms: 10_000, extra, ..Default::default() }).await
}

async fn set(app: &TestApp, assignments: &str) {
    exec(&app.db, &format!("UPDATE agents SET {assignments} WHERE id = '{}'", app.agent.id)).await;
}

/// Fires every body at once, each with a fresh key: (status, body) of each.
async fn race(app: &Arc<TestApp>, bodies: Vec<Value>) -> Vec<(u16, Value)> {
    join_all(bodies.into_iter().map(|body| {
        let app = Arc::clone(app);
        async move {
            let resp = app.route(&new_key(), &body).await;
            (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
        }
    }))
    .await
}

fn settled(results: &[(u16, Value)]) -> usize {
    results.iter().filter(|(s, b)| *s == 200 && b["payment"]["status"] == "settled").count()
}

fn over_budget(results: &[(u16, Value)]) -> usize {
    results.iter().filter(|(s, b)| *s == 402 && b["code"] == "payment_over_budget").count()
}

async fn spend(app: &TestApp) -> x402_router::payments::Spend {
    x402_router::payments::store::agent_spend(&mut app.db.conn().await, app.agent.id, false).await.unwrap().unwrap()
}

#[actix_web::test]
async fn usdc_and_an_18_decimal_token_share_one_budget_raced_and_never_pay_above_it() {
    let chain = Devnet::start().await;
    let other = chain.upstream_of(chain.token18, price18()).await;
    let app = Arc::new(budget_app(&chain).await);
    // Five prices of 0.01 USD, whichever token pays them.
    set(&app, &format!("daily_budget = {}", 5 * PRICE)).await;
    let (usdc_before, t18_before) =
        (chain.balance_in(chain.token, PAY_TO).await, chain.balance_in(chain.token18, PAY_TO).await);
    let usdc_body = json!({"url": chain.url("/v2/weather"), "max_amount": PRICE.to_string()});
    let t18_body = json!({"url": other.url("/v2/weather"), "max_amount": PRICE.to_string()});
    // One of each first (both tokens surely count), then 22 at once for the three left.
    let first = race(&app, vec![usdc_body.clone()]).await;
    let second = race(&app, vec![t18_body.clone()]).await;
    assert_eq!((settled(&first), settled(&second)), (1, 1), "{first:?} {second:?}");
    let bodies = (0..22).map(|i| if i % 2 == 0 { usdc_body.clone() } else { t18_body.clone() }).collect();
    let results = race(&app, bodies).await;
    let statuses: Vec<u16> = results.iter().map(|r| r.0).collect();
    assert_eq!(settled(&results), 3, "{statuses:?}");
    assert_eq!(over_budget(&results), 19, "{statuses:?}");
    // Counted on-chain, in each token's own units.
    let usdc_moved = chain.balance_in(chain.token, PAY_TO).await - usdc_before;
    let t18_moved = chain.balance_in(chain.token18, PAY_TO).await - t18_before;
    assert_eq!(usdc_moved % U256::from(PRICE), U256::ZERO);
    assert_eq!(t18_moved % price18(), U256::ZERO);
    let paid = usdc_moved / U256::from(PRICE) + t18_moved / price18();
    assert_eq!(paid, U256::from(5u8), "usdc {usdc_moved}, 18-decimal {t18_moved}");
    let spend = spend(&app).await;
    assert_eq!((spend.settled_24h.as_str(), spend.remaining_24h.as_deref()), ("50000", Some("0")));
    // The well-known description states the budget unit.
    let described: Value =
        app.client.get(format!("{}/.well-known/x402-router", app.address)).send().await.unwrap().json().await.unwrap();
    assert_eq!(described["unit"], json!({"decimals": 6, "symbol": "USD"}));
}

#[actix_web::test]
async fn tiny_18_decimal_payments_are_rounded_against_the_spender_never_free() {
    let chain = Devnet::start().await;
    // One wei of the 18-decimal token: 10^-12 of a budget unit, counted as one whole unit.
    let other = chain.upstream_of(chain.token18, U256::from(1u8)).await;
    let app = Arc::new(budget_app(&chain).await);
    set(&app, "daily_budget = 3").await;
    let before = chain.balance_in(chain.token18, PAY_TO).await;
    let body = json!({"url": other.url("/v2/weather"), "max_amount": "1"});
    let results = race(&app, vec![body.clone(); 12]).await;
    let statuses: Vec<u16> = results.iter().map(|r| r.0).collect();
    assert_eq!(settled(&results), 3, "{statuses:?}");
    assert_eq!(over_budget(&results), 9, "{statuses:?}");
    assert_eq!(chain.balance_in(chain.token18, PAY_TO).await - before, U256::from(3u8));
    assert_eq!(spend(&app).await.remaining_24h.as_deref(), Some("0"));
    // A max_amount of 0 budget units pays nothing, however small the price.
    let resp = app.route(&new_key(), &json!({"url": other.url("/v2/weather"), "max_amount": "0"})).await;
    assert_eq!(resp.status(), 402);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payment_over_max_amount");
}

#[actix_web::test]
async fn the_per_call_cap_and_max_amount_read_in_budget_units() {
    let chain = Devnet::start().await;
    // 0.01 USD and one wei: 10001 budget units once rounded up.
    let dear = chain.upstream_of(chain.token18, price18() + U256::from(1u8)).await;
    let fair = chain.upstream_of(chain.token18, price18()).await;
    let app = budget_app(&chain).await;
    set(&app, &format!("max_per_call = {PRICE}")).await;
    let body = |u: &SecondUpstream| json!({"url": u.url("/v2/weather"), "max_amount": "20000"});
    let resp = app.route(&new_key(), &body(&dear)).await;
    assert_eq!(resp.status(), 402);
    let refused: Value = resp.json().await.unwrap();
    assert_eq!(refused["code"], "payment_over_budget", "{refused}");
    let resp = app.route(&new_key(), &body(&fair)).await;
    assert_eq!(resp.status(), 200);
    // max_amount counts budget units: 10000 pays 10^16 atomic units of the 18-decimal token.
    set(&app, "max_per_call = NULL").await;
    let exact = json!({"url": fair.url("/v2/weather"), "max_amount": PRICE.to_string()});
    assert_eq!(app.route(&new_key(), &exact).await.status(), 200);
    let under = json!({"url": dear.url("/v2/weather"), "max_amount": PRICE.to_string()});
    let resp = app.route(&new_key(), &under).await;
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payment_over_max_amount");
    assert_eq!(chain.balance_in(chain.token18, PAY_TO).await, price18() * U256::from(2u8));
    // The approval threshold too: 10000 budget units pass it, 10001 wait for an operator.
    set(&app, &format!("approval_above = {PRICE}")).await;
    assert_eq!(app.route(&new_key(), &body(&fair)).await.status(), 200);
    let resp = app.route(&new_key(), &body(&dear)).await;
    let held: Value = resp.json().await.unwrap();
    assert_eq!(held["code"], "approval_pending", "{held}");
    assert_eq!(chain.balance_in(chain.token18, PAY_TO).await, price18() * U256::from(3u8));
}

// ---------------------------------------------------------------------------------------------
// The conversion, as properties: Rust's `Rate::charge` and the ledger's SQL (`usage::CHARGE`).

/// Amounts up to 10^30 (beyond any real price), values as fractions, decimals 0 to 36.
fn case() -> impl Strategy<Value = (u128, u64, u64, u8, u8)> {
    (0u128..10u128.pow(30), 1u64..1_000_000, 1u64..1_000_000, 0u8..=36, 0u8..=36)
}

fn rate_of(num: u64, den: u64, asset: u8, budget: u8) -> Rate {
    Rate::of_asset(Rate::new(U256::from(num), U256::from(den)).unwrap(), asset, budget).unwrap()
}

proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 3000, failure_persistence: None, ..Default::default() })]

    /// A charge is never less than the exact value, and less than one budget unit more.
    #[test]
    fn a_charge_rounds_up_by_less_than_one_unit((a, num, den, asset, budget) in case()) {
        let rate = rate_of(num, den, asset, budget);
        let charge = rate.charge(Amount::from_u256(U256::from(a))).unwrap().as_u256();
        let exact = U256::from(a) * rate.num();
        prop_assert!(charge * rate.den() >= exact);
        prop_assert!(charge * rate.den() < exact + rate.den());
        prop_assert_eq!(charge.is_zero(), a == 0, "nothing is free but nothing");
    }

    /// Splitting a payment never makes it cheaper, and what `most_for` allows fits the budget.
    #[test]
    fn splitting_never_pays_less((a, num, den, asset, budget) in case(), b in 0u128..10u128.pow(30), left in 0u64..u64::MAX) {
        let rate = rate_of(num, den, asset, budget);
        let c = |x: U256| rate.charge(Amount::from_u256(x)).unwrap().as_u256();
        prop_assert!(c(U256::from(a)) + c(U256::from(b)) >= c(U256::from(a) + U256::from(b)));
        prop_assert!(c(U256::from(a)) <= c(U256::from(a) + U256::from(b)), "monotonic");
        let most = rate.most_for(Amount::from(left)).as_u256();
        prop_assert!(c(most) <= U256::from(left));
        prop_assert!(c(most + U256::from(1u8)) > U256::from(left));
    }
}

#[actix_web::test]
async fn the_ledgers_sql_charge_is_rusts_charge() {
    use diesel::sql_types::{Array, Text};
    use diesel_async::RunQueryDsl;
    use proptest::strategy::ValueTree;
    #[derive(diesel::QueryableByName)]
    struct Charged {
        #[diesel(sql_type = Text)]
        charge: String,
    }
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let cases = proptest::collection::vec(case(), 500).new_tree(&mut runner).unwrap().current();
    let rates: Vec<Rate> = cases.iter().map(|&(_, n, d, asset, budget)| rate_of(n, d, asset, budget)).collect();
    let text = |f: &dyn Fn(usize) -> String| (0..cases.len()).map(f).collect::<Vec<String>>();
    let amounts = text(&|i| cases[i].0.to_string());
    let nums = text(&|i| rates[i].num().to_string());
    let dens = text(&|i| rates[i].den().to_string());
    let db = TestDb::new().await;
    let sql = format!(
        "SELECT {}::text AS charge FROM unnest($1::text[]::numeric[], $2::text[]::numeric[], $3::text[]::numeric[]) \
           WITH ORDINALITY AS p(amount, budget_num, budget_den, i) ORDER BY i",
        x402_router::payments::usage::CHARGE
    );
    let charged: Vec<Charged> = diesel::sql_query(sql)
        .bind::<Array<Text>, _>(&amounts)
        .bind::<Array<Text>, _>(&nums)
        .bind::<Array<Text>, _>(&dens)
        .load(&mut db.conn().await)
        .await
        .unwrap();
    assert_eq!(charged.len(), cases.len());
    for (i, got) in charged.iter().enumerate() {
        let want = rates[i].charge(Amount::from_u256(U256::from(cases[i].0))).unwrap();
        assert_eq!(got.charge, want.to_string(), "{:?} at {}", cases[i], rates[i]);
    }
}

/// The configuration as `serve` reads it: mixed decimals are refused without a budget
/// currency (as before), accepted with one, and a budget currency refuses what it cannot count
/// yet (batch-settlement channels, Solana).
#[test]
fn start_up_refuses_mixed_decimals_unless_budgets_have_a_currency() {
    use clap::Parser;
    use x402_router::commands::{Cli, Command};
    let (usdc, t18) = ("0x00000000000000000000000000000000000000aa", "0x00000000000000000000000000000000000000bb");
    let read = |extra: &[(&str, String)]| {
        let mut given = vec![
            ("x402-rpc-urls".to_owned(), "eip155:84532=http://127.0.0.1:1".to_owned()),
            ("x402-assets".to_owned(), format!("eip155:84532={usdc}@6,eip155:84532={t18}@18")),
        ];
        given.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        let options = AppOptions { extra: given, ..Default::default() };
        let args = serve_args(&options, "postgres://postgres@127.0.0.1/none", "p", "127.0.0.1:0");
        let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else { panic!("not serve") };
        x402_router::config::Config::from_args(&serve).map(|c| c.payments.budget).map_err(|e| e.to_string())
    };
    let e = read(&[]).unwrap_err();
    assert!(e.contains("mixes assets of different units") && e.contains("BUDGET_CURRENCY"), "{e}");
    let values = format!("eip155:84532={usdc}=1,eip155:84532={t18}=1");
    let budget = read(&[("budget-currency", "USD".into()), ("x402-asset-values", values.clone())]).unwrap().unwrap();
    assert_eq!((budget.currency.as_str(), budget.decimals, budget.values.len()), ("USD", 6, 2));
    let e = read(&[("budget-currency", "USD".into())]).unwrap_err();
    assert!(e.contains("X402_ASSET_VALUES") && e.contains("give the value"), "{e}");
    let batch =
        [("budget-currency", "USD".into()), ("x402-asset-values", values), ("x402-schemes", "batch-settlement".into())];
    assert!(read(&batch).unwrap_err().contains("batch-settlement"));
}

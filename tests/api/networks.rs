//! Breadth on EVM (issue 15): any chain by its CAIP-2 id, the 412
//! `permit2_allowance_required` and `x402-router wallet approve-permit2`. Real anvil.

use alloy::primitives::{Address, U256, address};
use serde_json::{Value, json};

use crate::helpers::*;

const PERMIT2: Address = address!("0x000000000022D473030F116dDEE9F6B43aC78BA3");

fn approve(chain: &Devnet, args: &[&str]) -> std::process::Output {
    router_command()
        .args(["wallet", "approve-permit2"])
        .args(args)
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .env("X402_RPC_URLS", format!("eip155:{}={}", chain.chain_id, chain.rpc_url))
        .env("X402_ASSETS", format!("eip155:{}={}@6", chain.chain_id, chain.token))
        .output()
        .unwrap()
}

/// A chain no table knows, configured by its CAIP-2 id only: the router pays on it.
#[actix_web::test]
async fn a_router_pays_on_a_chain_of_any_id_given_by_its_caip2_id() {
    let chain = Devnet::start_on(4242).await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let before = chain.balance(PAY_TO).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});
    let env: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(env["status"], 200, "{env}");
    assert_eq!(env["payment"]["network"], "eip155:4242");
    assert_eq!(env["payment"]["status"], "settled");
    assert!(chain.authorization_used(ROUTER_ADDRESS, router_nonce(app.agent.id, &key, &body)).await);
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(PRICE));
}

/// An upstream whose facilitator needs a Permit2 approval answers 412 (a real check of the
/// router's allowance on-chain): its own code, the command in the message, nothing moved;
/// after `wallet approve-permit2` a new call pays.
#[actix_web::test]
async fn a_412_permit2_allowance_required_names_the_approval_and_after_it_a_new_call_pays() {
    let chain = Devnet::start().await;
    // Whatever the test chain was set up with, the router's wallet starts without an approval
    // (`--amount 0` revokes one).
    let token = chain.token.to_string();
    let out = approve(&chain, &["--network", "eip155:84532", "--asset", &token, "--amount", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let before = chain.balance(PAY_TO).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/permit2-gate"), "max_amount": "50000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["code"], "permit2_allowance_required", "{err}");
    assert_eq!(err["status"], 412);
    assert_eq!(err["payment"]["status"], "rejected");
    let command = format!("x402-router wallet approve-permit2 --network eip155:84532 --asset {}", chain.token);
    assert!(err["error"].as_str().unwrap().contains(&command), "{err}");
    assert!(!chain.authorization_used(ROUTER_ADDRESS, router_nonce(app.agent.id, &key, &body)).await);
    assert_eq!(chain.balance(PAY_TO).await, before);
    assert_eq!(chain.stats().await["/v2/permit2-gate"]["permit2_required"], 1);

    assert_eq!(chain.allowance(ROUTER_ADDRESS, PERMIT2).await, U256::ZERO);
    let out = approve(&chain, &["--network", "eip155:84532", "--asset", &token]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(chain.allowance(ROUTER_ADDRESS, PERMIT2).await, U256::MAX);
    assert_eq!(done["allowance"], U256::MAX.to_string());
    assert_eq!(done["previous_allowance"], "0");
    assert_eq!(done["spender"], PERMIT2.to_checksum(None));
    assert!(done["tx_hash"].as_str().unwrap().starts_with("0x"));

    let env: Value = app.route(&new_key(), &body).await.json().await.unwrap();
    assert_eq!(env["status"], 200, "{env}");
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(PRICE));
}

/// The command approves exactly the amount asked, and refuses a network or token the
/// router does not pay with, before any transaction; it never prints the key.
#[actix_web::test]
async fn approve_permit2_sets_the_amount_and_refuses_what_the_router_does_not_pay_with() {
    let chain = Devnet::start().await;
    let token = chain.token.to_string();
    let out = approve(&chain, &["--network", "base-sepolia", "--asset", &token, "--amount", "12345"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(chain.allowance(ROUTER_ADDRESS, PERMIT2).await, U256::from(12_345u64));

    let other = "0x0000000000000000000000000000000000000001";
    let refusals: [(&[&str], &str); 4] = [
        (&["--network", "eip155:8453", "--asset", &token], "no RPC URL"),
        (&["--network", "eip155:84532", "--asset", other], "not a token the router pays with"),
        (&["--network", "eip155:84532", "--asset", &token, "--amount", "1.5"], "--amount"),
        (&["--network", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "--asset", &token], "--network"),
    ];
    for (args, named) in refusals {
        let out = approve(&chain, args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(!stderr.contains(ROUTER_KEY.trim_start_matches("0x")));
    }
    assert_eq!(chain.allowance(ROUTER_ADDRESS, PERMIT2).await, U256::from(12_345u64), "nothing else was sent");
}

/// A network given an RPC URL and no token pays its built-in USDC only: on a chain with OP
/// Mainnet's id (10, not among the Base defaults) the router offers Circle's OP USDC and
/// refuses the test token, signing nothing.
#[actix_web::test]
async fn a_network_without_a_configured_token_pays_only_its_built_in_usdc() {
    let chain = Devnet::start_on(10).await;
    let extra = vec![("x402-rpc-urls".to_owned(), format!("eip155:10={}", chain.rpc_url))];
    let app = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    let known: Value =
        reqwest::get(format!("{}/.well-known/x402-router", app.address)).await.unwrap().json().await.unwrap();
    assert_eq!(
        known["networks"],
        json!([{"network": "eip155:10", "v1_name": null, "assets": [{
            "asset": "0x0b2C639c533813f4Aa9D7837CAf62653d097Ff85", "decimals": 6, "symbol": "USDC",
            "asset_transfer_methods": ["eip3009", "permit2"], "schemes": ["exact", "upto"], "x402_versions": [2]}]}])
    );
    assert_eq!(known["unit"], json!({"decimals": 6, "symbol": "USDC"}), "the built-in USDC is USDC without asking");
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
    assert_eq!(resp.status(), 402);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payment_unsupported");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0);
}

/// `/.well-known/x402-router` says what the running router pays with, from its configuration
/// (issue 26): two configurations, two answers. A token marked `+permit2` is paid only via
/// Permit2 (so never in x402 v1); a network with a v1 name and an EIP-3009 token takes v1 too.
#[actix_web::test]
async fn discovery_lists_what_the_configuration_pays_with() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let known: Value =
        reqwest::get(format!("{}/.well-known/x402-router", app.address)).await.unwrap().json().await.unwrap();
    assert_eq!(known["x402_versions"], json!([1, 2]), "{known}");
    assert_eq!(known["schemes"], json!(["exact", "upto"]));
    assert_eq!(known["asset_transfer_methods"], json!(["eip3009", "permit2"]));
    assert_eq!(
        known["networks"],
        json!([{"network": "eip155:84532", "v1_name": "base-sepolia", "assets": [{
            "asset": chain.token.to_checksum(None), "decimals": 6, "symbol": "USDC",
            "asset_transfer_methods": ["eip3009", "permit2"], "schemes": ["exact", "upto"], "x402_versions": [1, 2]}]}])
    );
    assert_eq!(known["unit"], json!({"decimals": 6, "symbol": "USDC"}), "the token's own symbol()");

    // Only a token without EIP-3009, on a chain with no v1 name.
    let other = Devnet::start_on(4242).await;
    let extra = vec![
        ("x402-rpc-urls".to_owned(), format!("eip155:4242={}", other.rpc_url)),
        ("x402-assets".to_owned(), format!("eip155:4242={}@6+permit2", other.plain_token)),
    ];
    let app = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    let known: Value =
        reqwest::get(format!("{}/.well-known/x402-router", app.address)).await.unwrap().json().await.unwrap();
    assert_eq!(known["x402_versions"], json!([2]), "{known}");
    assert_eq!(known["asset_transfer_methods"], json!(["permit2"]));
    assert_eq!(
        known["networks"],
        json!([{"network": "eip155:4242", "v1_name": null, "assets": [{
            "asset": other.plain_token.to_checksum(None), "decimals": 6, "symbol": "PLAIN",
            "asset_transfer_methods": ["permit2"], "schemes": ["exact", "upto"], "x402_versions": [2]}]}])
    );
    assert_eq!(known["unit"], json!({"decimals": 6, "symbol": "PLAIN"}));
}

/// The symbol amounts are shown in is only ever shown, and a token's `symbol()` is hostile
/// input: an asset whose symbol cannot be read (here an address without code) is listed
/// without one and the router starts all the same; two assets of one unit with different
/// symbols (or one without) leave the unit without a symbol, so no amount is shown in a
/// symbol it is not. (What a readable but hostile symbol gives is
/// `config::symbols::tests::a_symbol_is_shown_only_when_it_is_a_short_plain_word`.)
#[actix_web::test]
async fn an_asset_without_a_readable_symbol_is_listed_without_one_and_the_unit_has_none() {
    let chain = Devnet::start().await;
    let codeless = Address::repeat_byte(0x42);
    let extra = vec![
        ("x402-rpc-urls".to_owned(), format!("eip155:84532={}", chain.rpc_url)),
        ("x402-assets".to_owned(), format!("eip155:84532={}@6,eip155:84532={codeless}@6", chain.token)),
    ];
    let app = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    let known: Value =
        reqwest::get(format!("{}/.well-known/x402-router", app.address)).await.unwrap().json().await.unwrap();
    let mut got: Vec<(String, Value)> = known["networks"][0]["assets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["asset"].as_str().unwrap().to_owned(), a["symbol"].clone()))
        .collect();
    let mut want = vec![(chain.token.to_checksum(None), json!("USDC")), (codeless.to_checksum(None), Value::Null)];
    want.sort_by_key(|a| a.0.to_lowercase());
    got.sort_by_key(|a| a.0.to_lowercase());
    assert_eq!(got, want, "{known}");
    assert_eq!(known["unit"], json!({"decimals": 6, "symbol": null}));
}

//! The Solana settings: `SOLANA_PRIVATE_KEY` (or `SOLANA_PRIVATE_KEY_FILE`), and the `solana:`
//! entries of `X402_RPC_URLS` and `X402_ASSETS` (the EVM parsers skip them).
//!
//! A Solana network is paid on only with an RPC URL, a mint and the key; each mint's decimals
//! must be the router's unit (caps and budgets are atomic units of one unit). A network may be
//! listed with several URLs: the first is read to pay, the others are witnesses, asked before
//! a payment is signed again or released as never landing (`x402::svm::SvmEndpoints`); with
//! one URL alone, that never happens (docs/operations.md, "Solana").

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use url::Url;

use super::ConfigError;
use super::parse::{is_solana_entry, split_list};
use crate::x402::svm::{SvmAddress, SvmNetwork, SvmSigner, transfer::MAX_COMPUTE_UNIT_PRICE};
use clap::Args;

/// The Solana wallet (x402 `exact` on `solana:` networks).
#[derive(Debug, Args, Clone)]
pub struct SolanaArgs {
    /// The paying Solana wallet's key: a JSON array of 64 bytes (as `solana-keygen` writes) or
    /// a base58 keypair. Prefer --solana-private-key-file.
    #[arg(long, env = "SOLANA_PRIVATE_KEY", hide_env_values = true)]
    pub solana_private_key: Option<String>,
    /// A file holding the paying Solana wallet's key.
    #[arg(long, env = "SOLANA_PRIVATE_KEY_FILE")]
    pub solana_private_key_file: Option<String>,
    /// The compute-unit price the router sets on its Solana payments, in micro-lamports (paid
    /// by the upstream's fee payer; at most 5000000). Never taken from an upstream.
    #[arg(long, env = "SOLANA_COMPUTE_UNIT_PRICE", default_value = "1")]
    pub solana_compute_unit_price: String,
}

/// Circle's USDC mints (6 decimals) on Solana mainnet and devnet: the mint paid on a network of
/// `X402_RPC_URLS` for which `X402_ASSETS` names none.
const BUILT_IN_USDC: [(&str, &str); 2] = [
    ("solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"),
    ("solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU"),
];
const USDC_DECIMALS: u8 = 6;

/// What the router pays with on Solana.
#[derive(Debug, Clone)]
pub struct SolanaConfig {
    /// The paying wallet (the token owner; never the fee payer).
    pub signer: Arc<SvmSigner>,
    pub networks: BTreeMap<SvmNetwork, SolanaNetwork>,
    /// The compute-unit price the router sets (micro-lamports; the fee payer pays it).
    pub compute_unit_price: u64,
    /// The decimals of every mint: the router's unit (that of its EVM assets, when known).
    pub unit: u8,
}

/// One Solana network: its RPC endpoints (the first is read to pay, the others are witnesses)
/// and the mints paid there, with their decimals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SolanaNetwork {
    /// Never empty.
    pub rpc_urls: Vec<Url>,
    pub mints: Vec<(SvmAddress, u8)>,
    /// The symbols the operator gave mints in `X402_ASSETS` (only ever shown).
    pub symbols: Vec<(SvmAddress, String)>,
}

impl SolanaConfig {
    /// The decimals configured for `mint` on `network`, if the router pays with it there.
    pub fn decimals(&self, network: &SvmNetwork, mint: &SvmAddress) -> Option<u8> {
        self.networks.get(network)?.mints.iter().find(|(m, _)| m == mint).map(|(_, d)| *d)
    }

    /// The symbol `mint`'s amounts are shown in: the one given in `X402_ASSETS`, else `USDC`
    /// for the built-in USDC mint, else none (shown by its address).
    pub fn symbol(&self, network: &SvmNetwork, mint: &SvmAddress) -> Option<String> {
        let given = self.networks.get(network).and_then(|n| n.symbols.iter().find(|(m, _)| m == mint));
        given.map(|(_, s)| s.clone()).or_else(|| symbol(network, mint).map(str::to_owned))
    }
}

/// The Solana entries of `X402_RPC_URLS`: each network's URLs, in the order given (the first
/// is read to pay; the others are witnesses).
///
/// # Errors
/// A malformed entry, or a URL listed twice for a network. Messages never quote a URL.
pub fn rpc_urls(raw: &str) -> Result<BTreeMap<SvmNetwork, Vec<Url>>, ConfigError> {
    let mut out: BTreeMap<SvmNetwork, Vec<Url>> = BTreeMap::new();
    for item in split_list(raw).filter(|i| is_solana_entry(i)) {
        let (network, url) = pair("X402_RPC_URLS", item)?;
        let list = out.entry(network.clone()).or_default();
        let position = list.len();
        let parsed = Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https")).ok_or_else(|| {
            ConfigError::new("X402_RPC_URLS", format!("URL {position} of {network} is not an http(s) URL"))
        })?;
        if list.contains(&parsed) {
            return Err(ConfigError::new("X402_RPC_URLS", format!("URL {position} of {network} is listed twice")));
        }
        list.push(parsed);
    }
    Ok(out)
}

/// The Solana entries of `X402_ASSETS`: `solana:<ref>=<mint>@<decimals>[:<SYMBOL>]` (decimals
/// required but for the built-in USDC mints; the symbol only ever shown, see [`mint_entries`]).
///
/// # Errors
/// A malformed entry.
pub fn assets(raw: &str) -> Result<BTreeMap<SvmNetwork, Vec<(SvmAddress, u8)>>, ConfigError> {
    Ok(mint_entries(raw)?
        .into_iter()
        .map(|(network, list)| (network, list.into_iter().map(|(m, d, _)| (m, d)).collect()))
        .collect())
}

/// A Solana mint of `X402_ASSETS`: its address, decimals, and the symbol its amounts are shown
/// in when the operator gave one.
type MintEntry = (SvmAddress, u8, Option<String>);

/// The Solana entries of `X402_ASSETS` with their symbols. An SPL mint has no `symbol()` to
/// read, so the operator may name it (`<mint>@6:USDC`); it is only ever shown (the console,
/// `/.well-known/x402-router`), never used to decide a payment, and must be a short plain word
/// (`config::symbols::shown_symbol`). Without one, the built-in USDC mints are `USDC` and
/// others have none.
///
/// # Errors
/// A malformed entry.
fn mint_entries(raw: &str) -> Result<BTreeMap<SvmNetwork, Vec<MintEntry>>, ConfigError> {
    let mut out: BTreeMap<SvmNetwork, Vec<MintEntry>> = BTreeMap::new();
    for item in split_list(raw).filter(|i| is_solana_entry(i)) {
        let (network, spec) = pair("X402_ASSETS", item)?;
        // Neither base58 nor decimals hold a ':', so the last one starts the symbol.
        let (spec, symbol) = match spec.rsplit_once(':') {
            Some((rest, raw_symbol)) => {
                let symbol = super::symbols::shown_symbol(raw_symbol.trim()).ok_or_else(|| {
                    ConfigError::new(
                        "X402_ASSETS",
                        format!("{raw_symbol:?} is not a symbol (1 to 16 ASCII letters, digits, `.`, `_`, `-` or `$`)"),
                    )
                })?;
                (rest, Some(symbol))
            }
            None => (spec, None),
        };
        let (mint, decimals) = match spec.split_once('@') {
            Some((m, d)) => (m.trim(), Some(d.trim())),
            None => (spec.trim(), None),
        };
        let mint = SvmAddress::from_str(mint)
            .map_err(|_| ConfigError::new("X402_ASSETS", format!("{mint:?} is not a Solana mint address")))?;
        let decimals = match decimals {
            Some(d) => d.parse::<u8>().ok().filter(|d| *d <= 36).ok_or_else(|| {
                ConfigError::new("X402_ASSETS", format!("{d:?} is not a number of decimals (0 to 36)"))
            })?,
            None => built_in_usdc(&network).filter(|m| *m == mint).map(|_| USDC_DECIMALS).ok_or_else(|| {
                ConfigError::new("X402_ASSETS", format!("{mint} on {network}: give its decimals (`{mint}@6`)"))
            })?,
        };
        let list = out.entry(network).or_default();
        if !list.iter().any(|(m, _, _)| *m == mint) {
            list.push((mint, decimals, symbol));
        }
    }
    Ok(out)
}

/// The symbol shown for `mint` on `network`: `USDC` for the built-in USDC mint, else none
/// (shown by its address).
pub fn symbol(network: &SvmNetwork, mint: &SvmAddress) -> Option<&'static str> {
    (built_in_usdc(network).as_ref() == Some(mint)).then_some(super::symbols::USDC)
}

fn built_in_usdc(network: &SvmNetwork) -> Option<SvmAddress> {
    let caip2 = network.caip2();
    BUILT_IN_USDC.iter().find(|(n, _)| *n == caip2).and_then(|(_, m)| SvmAddress::from_str(m).ok())
}

fn pair<'a>(env: &'static str, item: &'a str) -> Result<(SvmNetwork, &'a str), ConfigError> {
    let (network, value) = item
        .split_once('=')
        .ok_or_else(|| ConfigError::new(env, format!("{item:?} is not of the form network=value")))?;
    let network =
        SvmNetwork::parse(network.trim()).map_err(|e| ConfigError::new(env, format!("{:?}: {e}", network.trim())))?;
    Ok((network, value.trim()))
}

/// The Solana key from `SOLANA_PRIVATE_KEY` or `SOLANA_PRIVATE_KEY_FILE` (a JSON array of 64
/// bytes, as `solana-keygen` writes, or a base58 keypair); `None` when neither is set.
///
/// # Errors
/// Both set, an unreadable file, or a value that is not a key (never quoted).
pub fn load_signer(args: &SolanaArgs) -> Result<Option<SvmSigner>, ConfigError> {
    let Some((env, raw)) = super::secret_text(
        ("SOLANA_PRIVATE_KEY", args.solana_private_key.as_ref()),
        ("SOLANA_PRIVATE_KEY_FILE", args.solana_private_key_file.as_ref()),
    )?
    else {
        return Ok(None);
    };
    SvmSigner::parse(&raw).map(Some).map_err(|why| ConfigError::new(env, why))
}

/// The Solana settings of `serve`: `None` when no Solana network has an RPC URL. A network with
/// a URL needs the key and a mint (given, or the built-in USDC); every mint must have `unit`
/// decimals (the EVM assets' unit, when known).
///
/// # Errors
/// The first inconsistent or malformed setting.
pub fn config(
    rpc_raw: &str,
    assets_raw: &str,
    args: &SolanaArgs,
    unit: Option<u8>,
) -> Result<Option<SolanaConfig>, ConfigError> {
    let urls = rpc_urls(rpc_raw)?;
    let mut mints = mint_entries(assets_raw)?;
    let signer = load_signer(args)?;
    let price: u64 = super::parse_num("SOLANA_COMPUTE_UNIT_PRICE", &args.solana_compute_unit_price)?;
    if price > MAX_COMPUTE_UNIT_PRICE {
        return Err(ConfigError::new(
            "SOLANA_COMPUTE_UNIT_PRICE",
            format!("must be at most {MAX_COMPUTE_UNIT_PRICE} micro-lamports per compute unit"),
        ));
    }
    if urls.is_empty() {
        return Ok(None);
    }
    let signer = signer.ok_or_else(|| {
        ConfigError::new(
            "SOLANA_PRIVATE_KEY",
            "is required to pay on the Solana networks of X402_RPC_URLS (or SOLANA_PRIVATE_KEY_FILE)",
        )
    })?;
    let mut networks = BTreeMap::new();
    let mut unit = unit;
    for (network, rpc_urls) in urls {
        let list = match mints.remove(&network) {
            Some(list) => list,
            None => match built_in_usdc(&network) {
                Some(usdc) => vec![(usdc, USDC_DECIMALS, None)],
                None => {
                    return Err(ConfigError::new(
                        "X402_ASSETS",
                        format!("names no mint for {network}, which X402_RPC_URLS lists"),
                    ));
                }
            },
        };
        let unit = *unit.get_or_insert(list[0].1);
        if let Some((mint, d, _)) = list.iter().find(|(_, d, _)| *d != unit) {
            return Err(ConfigError::new(
                "X402_ASSETS",
                format!(
                    "{network}={mint} has {d} decimals, the router's other assets {unit}: agents' caps and budgets are \
                     in atomic units, so one budget cannot span them"
                ),
            ));
        }
        let symbols = list.iter().filter_map(|(m, _, s)| Some((*m, s.clone()?))).collect();
        let mints = list.into_iter().map(|(m, d, _)| (m, d)).collect();
        networks.insert(network, SolanaNetwork { rpc_urls, mints, symbols });
    }
    let unit = unit.unwrap_or(USDC_DECIMALS);
    Ok(Some(SolanaConfig { signer: Arc::new(signer), networks, compute_unit_price: price, unit }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVNET: &str = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1";
    const MINT: &str = "H7po8GzzytgPCncihov4jk2BWGKhRNhMH8nRZdURCm4U";
    const KEY: &str = include_str!("../../tools/solana-chain/keys/payer.json");

    fn args(key: Option<&str>) -> SolanaArgs {
        SolanaArgs {
            solana_private_key: key.map(str::to_owned),
            solana_private_key_file: None,
            solana_compute_unit_price: "1".into(),
        }
    }

    #[test]
    fn solana_entries_are_told_apart_from_evm_ones() {
        use super::super::parse::is_solana_entry;
        assert!(is_solana_entry(&format!("{DEVNET}=http://a")));
        assert!(is_solana_entry("solana-devnet=http://a"));
        assert!(is_solana_entry("solana:not base58=http://a"), "malformed, but Solana's to refuse");
        assert!(!is_solana_entry("eip155:84532=http://a"));
        assert!(!is_solana_entry("base-sepolia=http://a"));
        let evm = super::super::parse_rpc_urls(&format!("eip155:84532=http://a,{DEVNET}=http://b")).unwrap();
        assert_eq!(evm.len(), 1);
    }

    #[test]
    fn a_solana_network_needs_a_url_a_key_and_a_mint_in_the_routers_unit() {
        let urls = format!("eip155:84532=http://a,{DEVNET}=http://127.0.0.1:1/key");
        let assets = format!("{DEVNET}={MINT}@6");
        let c = config(&urls, &assets, &args(Some(KEY)), Some(6)).unwrap().unwrap();
        let network = SvmNetwork::parse(DEVNET).unwrap();
        assert_eq!(c.decimals(&network, &SvmAddress::from_str(MINT).unwrap()), Some(6));
        assert!(!format!("{:?}", c.signer).contains('['), "the key is never shown");

        let e = config(&urls, &assets, &args(None), Some(6)).unwrap_err().to_string();
        assert!(e.contains("SOLANA_PRIVATE_KEY"), "{e}");
        let e = config(&urls, &format!("{DEVNET}={MINT}"), &args(Some(KEY)), Some(6)).unwrap_err().to_string();
        assert!(e.contains("give its decimals"), "{e}");
        let e = config(&urls, &format!("{DEVNET}={MINT}@9"), &args(Some(KEY)), Some(6)).unwrap_err().to_string();
        assert!(e.contains("9 decimals"), "{e}");
        // Without EVM decimals known, every Solana mint must share one unit.
        let two = format!("{DEVNET}=http://a,solana:4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z=http://c");
        let mixed = format!("{DEVNET}={MINT}@6,solana:4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z={MINT}@9");
        let e = config(&two, &mixed, &args(Some(KEY)), None).unwrap_err().to_string();
        assert!(e.contains("cannot span"), "{e}");
        assert_eq!(config(&urls, &assets, &args(Some(KEY)), None).unwrap().unwrap().unit, 6);
        let e = config(&urls, &format!("{DEVNET}=0xabc@6"), &args(Some(KEY)), Some(6)).unwrap_err().to_string();
        assert!(e.contains("not a Solana mint"), "{e}");
        // A mint's symbol is the operator's to give (only shown), and a short plain word.
        let mint = SvmAddress::from_str(MINT).unwrap();
        assert_eq!(c.symbol(&network, &mint), None, "none given, not the built-in USDC");
        let named = config(&urls, &format!("{DEVNET}={MINT}@6:USDC"), &args(Some(KEY)), Some(6)).unwrap().unwrap();
        assert_eq!(
            (named.symbol(&network, &mint).as_deref(), named.decimals(&network, &mint)),
            (Some("USDC"), Some(6))
        );
        let e = config(&urls, &format!("{DEVNET}={MINT}@6:<b>x"), &args(Some(KEY)), Some(6)).unwrap_err().to_string();
        assert!(e.contains("not a symbol"), "{e}");
        // Devnet has a built-in USDC mint; a CAIP-2 id of another cluster does not.
        let built_in = config(&urls, "", &args(Some(KEY)), Some(6)).unwrap().unwrap();
        assert_eq!(built_in.networks[&network].mints.len(), 1);
        let usdc = built_in.networks[&network].mints[0].0;
        assert_eq!(built_in.symbol(&network, &usdc).as_deref(), Some("USDC"));
        let other = "solana:4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z=http://c";
        let e = config(other, "", &args(Some(KEY)), Some(6)).unwrap_err().to_string();
        assert!(e.contains("names no mint"), "{e}");
        let e = config(&format!("{DEVNET}=http://a/k,{DEVNET}=http://a/k"), &assets, &args(Some(KEY)), None);
        assert!(e.unwrap_err().to_string().contains("listed twice"));
        // Several URLs of one network: the first pays, the others witness, in the order given.
        let two = config(&format!("{DEVNET}=http://b,{DEVNET}=http://a"), &assets, &args(Some(KEY)), None);
        let given: Vec<String> = two.unwrap().unwrap().networks[&network].rpc_urls.iter().map(Url::to_string).collect();
        assert_eq!(given, ["http://b/", "http://a/"]);
        let e = config(&format!("{DEVNET}=ftp://a/secret"), &assets, &args(Some(KEY)), None).unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        // Without a Solana URL there is nothing to pay on (and no key needed).
        assert!(config("eip155:84532=http://a", "", &args(None), Some(6)).unwrap().is_none());
        let mut bad = args(Some("[1,2,3]"));
        let e = config(&urls, &assets, &bad, Some(6)).unwrap_err().to_string();
        assert!(e.contains("SOLANA_PRIVATE_KEY") && !e.contains("[1,2,3]"), "{e}");
        bad = args(Some(KEY));
        bad.solana_compute_unit_price = "5000001".into();
        assert!(config(&urls, &assets, &bad, Some(6)).is_err());
    }
}

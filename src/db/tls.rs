//! How the router reaches Postgres: the `DATABASE_URL` parsed once into a
//! [`Connector`] that opens diesel-async connections over TLS (rustls) or plain TCP.
//!
//! The URL takes libpq's TLS parameters, with libpq's meaning:
//!
//! | `sslmode`       | TLS | server certificate checked |
//! |-----------------|-----|----------------------------|
//! | `disable`       | no  | —                          |
//! | `prefer` (default) | if the server offers it, else plain | no |
//! | `require`       | yes | no (but as `verify-ca` when `sslrootcert` is given, like libpq) |
//! | `verify-ca`     | yes | chain to a trusted root    |
//! | `verify-full`   | yes | chain and host name        |
//!
//! `sslrootcert=<file>` names a PEM file of trusted roots; without it the system's roots
//! are trusted (libpq's `sslrootcert=system`, which is what managed Postgres services
//! need). `sslrootcert=system` is accepted too. Both parameters are removed from the URL
//! before it reaches tokio-postgres, which does not know the verifying modes.
//!
//! With several hosts (`host=a,b` or `postgres://a,b/db`) the same TLS settings apply to
//! each; with `verify-full` each server's certificate must name the host it was reached by.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use diesel::ConnectionResult;
use diesel::result::ConnectionError;
use diesel_async::AsyncPgConnection;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A TLS setting for Postgres that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(pub String);

impl From<String> for TlsSetupError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<super::conninfo::BadConnInfo> for TlsSetupError {
    fn from(e: super::conninfo::BadConnInfo) -> Self {
        Self(e.0)
    }
}

impl From<&str> for TlsSetupError {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// libpq's `sslmode` values that the router supports (`allow` is not: it is never what an
/// operator wants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = TlsSetupError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode={other} is not supported (disable, prefer, require, verify-ca, verify-full)"
                )
                .into());
            }
        })
    }
}

/// Which roots a verifying mode trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The operating system's trust store.
    System,
    /// A PEM file.
    File(PathBuf),
}

/// The TLS part of a Postgres or Redis URL: `sslmode` and `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: SslMode,
    pub root_certs: RootCerts,
}

impl TlsParams {
    /// Removes `sslmode` and `sslrootcert` from `url`'s query and returns them (absent
    /// `sslmode` = `default_mode`). Other parameters stay as they were.
    ///
    /// # Errors
    /// An unknown `sslmode`, a repeated parameter, or an unparsable URL.
    pub fn take_from_url(url: &str, default_mode: SslMode) -> Result<(String, Self), TlsSetupError> {
        let mut parsed = url::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
        let mut mode = None;
        let mut root = None;
        let mut rest = Vec::new();
        for (k, v) in parsed.query_pairs() {
            match k.as_ref() {
                "sslmode" if mode.is_none() => mode = Some(v.parse::<SslMode>()?),
                "sslrootcert" if root.is_none() => {
                    root = Some(if v == "system" { RootCerts::System } else { RootCerts::File(PathBuf::from(&*v)) })
                }
                "sslmode" | "sslrootcert" => return Err(format!("{k} is given twice").into()),
                _ => rest.push((k.into_owned(), v.into_owned())),
            }
        }
        if rest.is_empty() {
            parsed.set_query(None);
        } else {
            // Percent-encoded with spaces as `%20`: libpq-style parsers (tokio-postgres among
            // them) read a `+` as a plus sign, so form encoding would corrupt e.g. `options`.
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace('+', "%20");
            let query: Vec<String> = rest.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect();
            parsed.set_query(Some(&query.join("&")));
        }
        Ok((parsed.into(), Self::resolve(mode, root, default_mode)))
    }

    /// Removes `sslmode` and `sslrootcert` from a Postgres connection string (either form,
    /// see [`super::conninfo`]) and returns them.
    ///
    /// # Errors
    /// An unknown `sslmode` or a repeated parameter.
    pub fn take_from_conninfo(
        info: &mut super::conninfo::ConnInfo,
        default_mode: SslMode,
    ) -> Result<Self, TlsSetupError> {
        let mode = info.take("sslmode")?.map(|m| m.parse::<SslMode>()).transpose()?;
        let root = info
            .take("sslrootcert")?
            .map(|v| if v == "system" { RootCerts::System } else { RootCerts::File(PathBuf::from(v)) });
        Ok(Self::resolve(mode, root, default_mode))
    }

    fn resolve(mode: Option<SslMode>, root: Option<RootCerts>, default_mode: SslMode) -> Self {
        let mut mode = mode.unwrap_or(default_mode);
        // libpq: "require" with a root certificate file behaves like "verify-ca".
        if mode == SslMode::Require && matches!(root, Some(RootCerts::File(_))) {
            mode = SslMode::VerifyCa;
        }
        Self { mode, root_certs: root.unwrap_or(RootCerts::System) }
    }

    /// The trusted roots, read now (so that a missing or empty file fails at start-up).
    ///
    /// # Errors
    /// An unreadable file, or one without a single certificate.
    pub fn root_store(&self) -> Result<RootCertStore, TlsSetupError> {
        let mut store = RootCertStore::empty();
        match &self.root_certs {
            RootCerts::System => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err("no usable system root certificates (set sslrootcert=<file>)".into());
                }
            }
            RootCerts::File(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                let (added, _) = store.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("sslrootcert {}: no certificate in the file", path.display()).into());
                }
            }
        }
        Ok(store)
    }

    /// The rustls client configuration for this mode. `None` for `disable`.
    ///
    /// # Errors
    /// See [`TlsParams::root_store`].
    pub fn client_config(&self) -> Result<Option<ClientConfig>, TlsSetupError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let config = match self.mode {
            SslMode::Disable => return Ok(None),
            SslMode::VerifyFull => builder.with_root_certificates(self.root_store()?).with_no_client_auth(),
            SslMode::VerifyCa => {
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(self.root_store()?),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| e.to_string())?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(inner))).with_no_client_auth()
            }
            SslMode::Prefer | SslMode::Require => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider.signature_verification_algorithms)))
                .with_no_client_auth(),
        };
        Ok(Some(config))
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name in it is not compared
/// with the host.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer`/`require`: encrypted, but any certificate is accepted (libpq's meaning of these
/// modes). The handshake signatures are still checked.
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Opens Postgres connections as `DATABASE_URL` says. Cheap to clone.
#[derive(Clone)]
pub struct Connector {
    config: tokio_postgres::Config,
    tls: Option<MakeRustlsConnect>,
    mode: SslMode,
    /// Where its connections count their statements (none: not counted).
    traffic: Option<super::Traffic>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio_postgres::Config's Debug redacts the password.
        f.debug_struct("Connector").field("config", &self.config).field("sslmode", &self.mode).finish()
    }
}

impl Connector {
    /// Parses a `postgres://` URL or libpq key/value pairs (several hosts allowed, with
    /// `target_session_attrs`) with its TLS parameters, and reads the root certificates.
    ///
    /// # Errors
    /// A one-line reason (the caller names the setting).
    pub fn from_url(url: &str) -> Result<Self, TlsSetupError> {
        let mut info = super::conninfo::ConnInfo::parse(url)?;
        let params = TlsParams::take_from_conninfo(&mut info, SslMode::Prefer)?;
        let mut config = tokio_postgres::Config::from_str(&info.to_string()).map_err(|e| e.to_string())?;
        config.ssl_mode(match params.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        });
        let tls = params.client_config()?.map(MakeRustlsConnect::new);
        Ok(Self { config, tls, mode: params.mode, traffic: None })
    }

    /// The same connector, its connections counting their statements into `traffic`.
    #[must_use]
    pub fn counting(mut self, traffic: Option<super::Traffic>) -> Self {
        self.traffic = traffic;
        self
    }

    /// The configured `sslmode`.
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// Opens one connection. The connection's driver task runs on the current runtime and
    /// watches the server's reported state ([`super::FailoverWatch`], installed as the
    /// connection's instrumentation).
    ///
    /// # Errors
    /// Connection, TLS or authentication failure, with tokio-postgres's message (which
    /// names the certificate problem, e.g. `invalid peer certificate: UnknownIssuer`).
    pub async fn connect(&self) -> ConnectionResult<AsyncPgConnection> {
        let fail = |e: tokio_postgres::Error| ConnectionError::BadConnection(postgres_error_chain(&e));
        let watch = super::FailoverWatch::counting(self.traffic.clone());
        let client = match &self.tls {
            Some(tls) => {
                let (client, conn) = self.config.connect(tls.clone()).await.map_err(fail)?;
                tokio::spawn(drive(conn, watch.read_only_flag()));
                client
            }
            None => {
                let (client, conn) = self.config.connect(tokio_postgres::NoTls).await.map_err(fail)?;
                tokio::spawn(drive(conn, watch.read_only_flag()));
                client
            }
        };
        let mut conn = AsyncPgConnection::try_from(client).await?;
        diesel_async::AsyncConnection::set_instrumentation(&mut conn, watch);
        Ok(conn)
    }
}

/// Drives one connection's socket until it closes (the client side then sees it closed, and
/// the pool discards it). After every message it reads the server's reported state: since
/// Postgres 14 a session is told, unasked, when `in_hot_standby` or
/// `default_transaction_read_only` change (`ParameterStatus`), so a connection whose server
/// stopped accepting writes is known without a round trip of ours.
async fn drive<S, T>(mut conn: tokio_postgres::Connection<S, T>, read_only: Arc<AtomicBool>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures_util::stream::poll_fn(move |cx| {
        let polled = conn.poll_message(cx);
        let on = |name: &str| conn.parameter(name) == Some("on");
        if on("in_hot_standby") || on("default_transaction_read_only") {
            read_only.store(true, Ordering::Release);
        }
        polled
    });
    // Notices and notifications are not used; an error ends the connection.
    while let Some(Ok(_)) = futures_util::StreamExt::next(&mut messages).await {}
}

/// tokio-postgres's `Display` says only "error performing TLS handshake"; the reason
/// (`invalid peer certificate: UnknownIssuer`) is in the source chain.
fn postgres_error_chain(e: &tokio_postgres::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Installs aws-lc-rs as the process's default rustls provider, for libraries that build
/// their rustls configuration from the default (the redis crate). Idempotent.
pub fn install_default_crypto_provider() {
    let _ = CryptoProvider::install_default(rustls::crypto::aws_lc_rs::default_provider());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_the_url_and_the_rest_is_kept() {
        let (url, p) = TlsParams::take_from_url(
            "postgres://u:p@db:5432/x?application_name=r&sslmode=verify-full&sslrootcert=/ca.pem",
            SslMode::Prefer,
        )
        .unwrap();
        assert_eq!(url, "postgres://u:p@db:5432/x?application_name=r");
        assert_eq!(p, TlsParams { mode: SslMode::VerifyFull, root_certs: RootCerts::File("/ca.pem".into()) });

        let (url, p) = TlsParams::take_from_url("postgres://db/x?sslmode=disable", SslMode::Prefer).unwrap();
        assert_eq!(url, "postgres://db/x");
        assert_eq!(p.mode, SslMode::Disable);

        let (_, p) = TlsParams::take_from_url("postgres://db/x", SslMode::Prefer).unwrap();
        assert_eq!(p, TlsParams { mode: SslMode::Prefer, root_certs: RootCerts::System });
    }

    #[test]
    fn require_with_a_root_file_verifies_the_chain_like_libpq() {
        let (_, p) =
            TlsParams::take_from_url("postgres://db/x?sslmode=require&sslrootcert=ca.pem", SslMode::Prefer).unwrap();
        assert_eq!(p.mode, SslMode::VerifyCa);
        let (_, p) =
            TlsParams::take_from_url("postgres://db/x?sslmode=require&sslrootcert=system", SslMode::Prefer).unwrap();
        assert_eq!(p.mode, SslMode::Require);
    }

    #[test]
    fn unknown_or_repeated_tls_parameters_are_refused() {
        assert!(TlsParams::take_from_url("postgres://db/x?sslmode=allow", SslMode::Prefer).is_err());
        assert!(TlsParams::take_from_url("postgres://db/x?sslmode=require&sslmode=disable", SslMode::Prefer).is_err());
        assert!(Connector::from_url("postgres://db/x?sslmode=verify-full&sslrootcert=/nonexistent.pem").is_err());
        assert!(Connector::from_url("host=db sslmode=require sslmode=disable").is_err());
    }

    #[test]
    fn multi_host_strings_in_both_forms_reach_tokio_postgres_with_their_tls_mode() {
        let kv = Connector::from_url(
            "host=127.0.0.1,127.0.0.1 port=5433,5434 user=postgres target_session_attrs=read-write sslmode=disable",
        )
        .unwrap();
        assert_eq!(kv.ssl_mode(), SslMode::Disable);
        assert_eq!(kv.config.get_ports(), [5433, 5434]);
        assert_eq!(kv.config.get_target_session_attrs(), tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        let url = Connector::from_url("postgres://u@a:5433,b:5434/db?target_session_attrs=read-write&sslmode=require")
            .unwrap();
        assert_eq!(url.ssl_mode(), SslMode::Require);
        assert_eq!(url.config.get_hosts().len(), 2);
        assert_eq!(url.config.get_target_session_attrs(), tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
}

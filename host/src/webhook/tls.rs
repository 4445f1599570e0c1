//! TLS for the webhook server: a certificate resolver that can be swapped while serving, and
//! the accept loop. Each handshake asks the resolver for the current certificate, so a
//! rotation affects the next handshake and never an open connection or one in flight.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::WebhookError;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A serving certificate chain and key, ready for rustls.
#[derive(Debug, Clone)]
pub struct ServingCert {
    key: Arc<CertifiedKey>,
    /// SHA-256 of the leaf certificate (DER), to tell certificates apart in logs and tests.
    pub fingerprint: String,
}

impl ServingCert {
    /// Parses a PEM chain (leaf first) and its PKCS#8/PKCS#1/SEC1 key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, WebhookError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| WebhookError::Certificate(format!("certificate PEM: {e}")))?;
        let leaf = chain
            .first()
            .ok_or_else(|| WebhookError::Certificate("no certificate in PEM".into()))?;
        let fingerprint = hex::encode(Sha256::digest(leaf.as_ref()));
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| WebhookError::Certificate(format!("key PEM: {e}")))?;
        let signing =
            provider::sign::any_supported_type(&key).map_err(|e| WebhookError::Certificate(format!("key: {e}")))?;
        Ok(Self {
            key: Arc::new(CertifiedKey::new(chain, signing)),
            fingerprint,
        })
    }
}

/// The certificate every new handshake gets; replaced atomically on rotation.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: RwLock<Option<ServingCert>>,
}

impl CertResolver {
    /// Serves `cert` from the next handshake on; returns true when it differs from before.
    pub fn set(&self, cert: ServingCert) -> bool {
        let mut slot = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let changed = slot.as_ref().map(|c| &c.fingerprint) != Some(&cert.fingerprint);
        if changed {
            tracing::info!(fingerprint = %cert.fingerprint, "webhook now serves a new certificate");
            *slot = Some(cert);
        }
        changed
    }

    /// Fingerprint of the certificate being served, if any.
    pub fn fingerprint(&self) -> Option<String> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|c| c.fingerprint.clone())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|c| Arc::clone(&c.key))
    }
}

/// A rustls server configuration (ring, TLS 1.2 and 1.3, HTTP/1.1) over `resolver`.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<rustls::ServerConfig>, WebhookError> {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Certificate(format!("TLS versions: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    Ok(Arc::new(config))
}

/// Accepts TLS connections on `listener` and serves `router` on each until `stopped`
/// resolves. A handshake or connection failure ends that connection only.
pub async fn serve(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    router: Router,
    stopped: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(config);
    tokio::pin!(stopped);
    loop {
        let (tcp, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // e.g. out of file descriptors: wait instead of spinning.
                    tracing::warn!(error = %e, "webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stopped => return,
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(tls), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

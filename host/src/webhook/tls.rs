//! TLS for the webhook server: a certificate resolver that can be swapped while serving, and
//! the accept loop. Each handshake asks the resolver for the current certificate, so a
//! rotation affects the next handshake and never an open connection or one in flight.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
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
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::WebhookError;

/// What one webhook server holds open for its clients: the API server needs a handful of
/// connections, so a peer flooding the port meets these bounds long before the operator's
/// memory or file descriptors run out.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Connections served at once from one source address: one peer holding its share open
    /// leaves the rest to the others, the API server among them (it calls from addresses of
    /// its own; one replica needs far fewer, at most 16 reviews run at once).
    pub max_per_peer: usize,
    /// How long a client may take to finish its TLS handshake.
    pub handshake: Duration,
    /// How long a client may take to send a request's headers, and how long a kept-alive
    /// connection may stay idle before its next request.
    pub headers: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_peer: 64,
            handshake: Duration::from_secs(10),
            headers: Duration::from_secs(10),
        }
    }
}

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
        let leaf = chain.first().ok_or_else(|| WebhookError::Certificate("no certificate in PEM".into()))?;
        let fingerprint = hex::encode(Sha256::digest(leaf.as_ref()));
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| WebhookError::Certificate(format!("key PEM: {e}")))?;
        let signing = provider::sign::any_supported_type(&key)
            .map_err(|e| WebhookError::Certificate(format!("key: {e}")))?;
        Ok(Self { key: Arc::new(CertifiedKey::new(chain, signing)), fingerprint })
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
        self.current.read().unwrap_or_else(PoisonError::into_inner).as_ref().map(|c| c.fingerprint.clone())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).as_ref().map(|c| Arc::clone(&c.key))
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
/// resolves, within `limits`. A handshake or connection failure ends that connection only.
pub async fn serve(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    router: Router,
    limits: ConnectionLimits,
    stopped: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = PeerSlots::new(limits.max_per_peer);
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
        let Some(peer_slot) = peers.acquire(peer.ip()) else {
            tracing::debug!(%peer, max = limits.max_per_peer, "webhook connection refused: too many open from this peer");
            drop(tcp);
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, max = limits.max_connections, "webhook connection refused: too many open");
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let tls = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.headers)
                .serve_connection(TokioIo::new(tls), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

/// Open connections per source address, each bounded.
#[derive(Clone)]
struct PeerSlots {
    max: usize,
    open: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's share of its peer's slots, given back when dropped.
struct PeerSlot {
    peers: PeerSlots,
    ip: IpAddr,
}

impl PeerSlots {
    fn new(max: usize) -> Self {
        Self { max, open: Arc::default() }
    }

    fn acquire(&self, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: self.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::webhook::certs::{issue_all, CertPolicy};
    use axum::routing::get;
    use rustls::pki_types::ServerName;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// A server on 127.0.0.1 within `limits`, and a TLS client trusting it.
    async fn server(limits: ConnectionLimits) -> (SocketAddr, tokio_rustls::TlsConnector) {
        let material = issue_all(&CertPolicy::default(), &["localhost".to_string()]).expect("certificates");
        let resolver = Arc::new(CertResolver::default());
        resolver.set(material.serving().expect("serving certificate"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let router = Router::new().route("/", get(|| async { "ok" }));
        let config = server_config(resolver).expect("config");
        tokio::spawn(serve(listener, config, router, limits, std::future::pending()));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(material.ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("CA");
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        (addr, tokio_rustls::TlsConnector::from(Arc::new(client)))
    }

    async fn get_ok(mut conn: tokio_rustls::client::TlsStream<TcpStream>) -> String {
        conn.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.ok();
        answer
    }

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_and_silent_ones_time_out() {
        let limits = ConnectionLimits {
            max_connections: 2,
            max_per_peer: 2,
            handshake: Duration::from_secs(2),
            headers: Duration::from_millis(500),
        };
        let (addr, connector) = server(limits).await;
        let connect = || async {
            let tcp = TcpStream::connect(addr).await?;
            connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await
        };

        // Two silent clients take both slots; a third is closed before its handshake ends.
        let started = Instant::now();
        let mut first = connect().await.expect("first connection");
        let _second = connect().await.expect("second connection");
        assert!(connect().await.is_err(), "a connection past the cap was served");
        // A client that never sends its headers is closed after the header timeout.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), first.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "the silent connection stayed open: {read:?}");
        assert!(started.elapsed() >= Duration::from_millis(450), "closed too early: {:?}", started.elapsed());
        // Their slots are free again: a client that asks is answered.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let third = connect().await.expect("a connection once the others are gone");
        let answer = get_ok(third).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// One source address holding its share of connections open (a flood) leaves the other
    /// connections to other peers, as the API server is.
    #[tokio::test]
    async fn one_peer_cannot_take_every_connection() {
        let limits = ConnectionLimits {
            max_connections: 4,
            max_per_peer: 2,
            handshake: Duration::from_secs(5),
            headers: Duration::from_secs(5),
        };
        let (addr, connector) = server(limits).await;
        let connect_from = |source: [u8; 4]| {
            let connector = connector.clone();
            async move {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::from((source, 0)))?;
                let tcp = socket.connect(addr).await?;
                connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await
            }
        };
        let _a = connect_from([127, 0, 0, 2]).await.expect("the flooder's first");
        let _b = connect_from([127, 0, 0, 2]).await.expect("the flooder's second");
        assert!(connect_from([127, 0, 0, 2]).await.is_err(), "a peer got more than its share");
        let other = connect_from([127, 0, 0, 1]).await.expect("another peer is still served");
        let answer = get_ok(other).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

//! `http`: one HTTP/1.1 request to a Pod's or a Service's address, over TLS verified against a
//! CA the instance's Secret holds when asked. One connection per request: these are health
//! and admin calls, seconds apart, and a pool would keep sockets to pods that come and go.

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use super::Capped;
use crate::runtime::Response;

/// User name and password read by the host from a Secret of the instance.
pub struct HttpAuth {
    pub username: String,
    pub password: String,
}

pub struct Http {
    pub address: SocketAddr,
    /// The CA bundle (PEM) to verify the server against, and the name it must carry.
    pub tls: Option<(String, String)>,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
    pub auth: Option<HttpAuth>,
}

impl Http {
    /// Sends the request and reads the answer, keeping at most `cap` bytes of the body.
    pub async fn run(&self, cap: usize) -> Result<Response, String> {
        let tcp = TcpStream::connect(self.address)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.address))?;
        match &self.tls {
            None => self.exchange(tcp, cap).await,
            Some((ca, server_name)) => {
                let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(ca)?));
                let name = ServerName::try_from(server_name.clone())
                    .map_err(|e| format!("server name {server_name}: {e}"))?;
                let tls =
                    connector.connect(name, tcp).await.map_err(|e| format!("TLS with {server_name}: {e}"))?;
                self.exchange(tls, cap).await
            }
        }
    }

    async fn exchange<S>(&self, stream: S, cap: usize) -> Result<Response, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        let driving = tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(self.method.as_str())
            .uri(self.path.as_str())
            .header(hyper::header::HOST, self.address.to_string());
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(auth) = &self.auth {
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", auth.username, auth.password));
            request = request.header(hyper::header::AUTHORIZATION, format!("Basic {token}"));
        }
        let body = Full::new(Bytes::from(self.body.clone().unwrap_or_default()));
        let request = request.body(body).map_err(|e| format!("building the request: {e}"))?;
        let answer = sender.send_request(request).await.map_err(|e| format!("HTTP request: {e}"));
        let result = match answer {
            Err(e) => Err(e),
            Ok(answer) => {
                let code = i32::from(answer.status().as_u16());
                let mut body = answer.into_body();
                let mut out = Capped::new(cap);
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
                    if let Some(data) = frame.data_ref() {
                        out.push(data);
                    }
                    // Past the cap the rest is not worth waiting for.
                    if out.truncated {
                        break;
                    }
                }
                Ok(Response {
                    code: Some(code),
                    stdout: out.text(),
                    truncated: out.truncated,
                    ..Response::default()
                })
            }
        };
        driving.abort();
        result
    }
}

/// A client configuration trusting only the CA bundle `ca_pem`.
fn client_config(ca_pem: &str) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("CA bundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("CA bundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no certificate".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// A server that accepts and never answers: the request's timeout ends the wait, and the
    /// connection goes with it (nothing keeps the socket open behind the answer).
    #[tokio::test]
    async fn a_silent_server_costs_a_timeout_and_no_lingering_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let mut received = 0;
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return received,
                    Ok(n) => received += n,
                }
            }
        });
        let http = Http {
            address,
            tls: None,
            method: "GET".into(),
            path: "/".into(),
            headers: Vec::new(),
            body: None,
            auth: None,
        };
        let answer = tokio::time::timeout(Duration::from_millis(300), http.run(1024)).await;
        assert!(answer.is_err(), "the server never answers: {answer:?}");
        let received = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the client closed its connection once the request was dropped")
            .expect("server task");
        assert!(received > 0, "the request was sent");
    }
}

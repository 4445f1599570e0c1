//! `exec`: a command in a container of a Pod of the instance, through the API server's exec
//! subresource (the operator needs `pods/exec` create; nothing reaches the pod directly).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Capped;
use crate::runtime::Response;

pub struct Exec {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    pub stdin: Option<String>,
}

impl Exec {
    /// Runs the command to its end (the caller bounds it in time), keeping at most `cap` bytes
    /// of stdout and of stderr. Output past the cap is not read: the stream is closed, so the
    /// operator's work stays bounded by the cap whatever the command prints (a command that
    /// goes on writing then fails on its closed output), and the answer says the output was
    /// cut and the exit code is unknown.
    pub async fn run(&self, client: &Client, cap: usize) -> Result<Response, String> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        let params = AttachParams::default()
            .container(self.container.clone())
            .stdin(self.stdin.is_some())
            .stdout(true)
            .stderr(true);
        let mut process = pods
            .exec(&self.pod, self.command.clone(), &params)
            .await
            .map_err(|e| format!("exec in pod {} container {}: {e}", self.pod, self.container))?;
        let status = process.take_status();
        if let (Some(mut stdin), Some(input)) = (process.stdin(), self.stdin.as_ref()) {
            stdin.write_all(input.as_bytes()).await.map_err(|e| format!("writing stdin: {e}"))?;
            stdin.shutdown().await.map_err(|e| format!("closing stdin: {e}"))?;
        }
        let (mut out, mut err) = (Capped::new(cap), Capped::new(cap));
        let (stdout, stderr) = (process.stdout(), process.stderr());
        // Either stream past its cap ends both reads: nobody waits for the other one to end.
        let cut = {
            let (mut o, mut e) = (Box::pin(drain(stdout, &mut out)), Box::pin(drain(stderr, &mut err)));
            tokio::select! {
                cut = &mut o => cut || e.await,
                cut = &mut e => cut || o.await,
            }
        };
        if cut {
            process.abort();
            return Ok(Response {
                truncated: true,
                error: Some(format!(
                    "output past the cap of {cap} bytes: the rest was not read and the command's streams were closed (exit code unknown)"
                )),
                stdout: out.text(),
                stderr: err.text(),
                ..Response::default()
            });
        }
        let status = match status {
            Some(status) => status.await,
            None => None,
        };
        process.join().await.map_err(|e| format!("exec stream: {e}"))?;
        let code = match exit_code(status.as_ref()) {
            Ok(code) => Some(code),
            Err(message) => {
                return Ok(Response { error: Some(message), stderr: err.text(), ..Response::default() })
            }
        };
        Ok(Response {
            code,
            truncated: out.truncated || err.truncated,
            stdout: out.text(),
            stderr: err.text(),
            ..Response::default()
        })
    }
}

/// Reads `stream` into `into` until it ends (false) or passes the cap (true).
async fn drain(stream: Option<impl tokio::io::AsyncRead + Unpin>, into: &mut Capped) -> bool {
    let Some(mut stream) = stream else { return false };
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        into.push(&buf[..n]);
        if into.truncated {
            return true;
        }
    }
    false
}

/// The API server reports success, or a failure whose `ExitCode` cause carries the command's
/// exit code; any other failure (the command not found, the container not running) is an
/// error with the API server's message.
fn exit_code(status: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) -> Result<i32, String> {
    let Some(status) = status else { return Err("the exec ended without a status".into()) };
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| status.message.clone().unwrap_or_else(|| "the exec failed".into()))
}

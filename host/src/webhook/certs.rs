//! The built-in CA: a CA and a serving certificate for the webhook, issued with rcgen, kept in
//! one Secret, and renewed when less than the threshold remains.
//!
//! Every replica runs the same loop: read the Secret, renew what is due (a write guarded by
//! the Secret's resourceVersion, so two replicas never both win), and load whatever the
//! Secret holds into the TLS resolver. The serving certificate is renewed under the same CA,
//! so the caBundle the API server trusts does not change during a rotation.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::OffsetDateTime;

use super::tls::ServingCert;
use super::WebhookError;

/// Secret keys (the `kubernetes.io/tls` layout plus the CA's own key).
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
/// Annotations that record what was issued, so renewal never has to parse X.509.
pub const CERT_NOT_AFTER: &str = "stateward.dev/cert-not-after";
pub const CA_NOT_AFTER: &str = "stateward.dev/ca-not-after";
pub const CERT_SANS: &str = "stateward.dev/cert-sans";
/// Counts serving certificates issued from this Secret (1 for the first).
pub const CERT_SERIAL: &str = "stateward.dev/cert-generation";

const CA_COMMON_NAME: &str = "stateward-webhook-ca";
/// Subject of the service CA: the managed clusters' certificates come from a CA of their own
/// (controller/service_certs.rs), so none of them can ever pass for the webhook.
pub const SERVICE_CA_COMMON_NAME: &str = "stateward-service-ca";

/// Lifetimes and thresholds of the built-in CA.
#[derive(Debug, Clone)]
pub struct CertPolicy {
    /// Lifetime of a serving certificate.
    pub cert_lifetime: Duration,
    /// Renew the serving certificate when less than this remains.
    pub renew_before: Duration,
    /// Lifetime of the CA.
    pub ca_lifetime: Duration,
}

impl Default for CertPolicy {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Self {
            cert_lifetime: Duration::from_secs(90 * DAY),
            renew_before: Duration::from_secs(30 * DAY),
            ca_lifetime: Duration::from_secs(3650 * DAY),
        }
    }
}

impl CertPolicy {
    /// How often the Secret is checked: a quarter of the threshold, between 0.5 s and 60 s.
    pub fn check_interval(&self) -> Duration {
        (self.renew_before / 4).clamp(Duration::from_millis(500), Duration::from_secs(60))
    }
}

/// A CA and a serving certificate in PEM, with their expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Material {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_not_after: i64,
    pub cert_not_after: i64,
    pub sans: Vec<String>,
    pub generation: u64,
}

fn ca_params(
    common_name: &str,
    unit: Option<&str>,
    not_after: OffsetDateTime,
) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.distinguished_name.push(DnType::OrganizationName, "stateward");
    if let Some(unit) = unit {
        params.distinguished_name.push(DnType::OrganizationalUnitName, unit);
    }
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_after = not_after;
    Ok(params)
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn after(d: Duration) -> OffsetDateTime {
    now() + time::Duration::try_from(d).unwrap_or(time::Duration::days(365))
}

/// A fresh CA plus a serving certificate for `sans`.
pub fn issue_all(policy: &CertPolicy, sans: &[String]) -> Result<Material, WebhookError> {
    let mut m = issue_ca(policy, CA_COMMON_NAME)?;
    m.sans = sans.to_vec();
    renew_serving(&mut m, policy, sans)?;
    Ok(m)
}

/// A fresh CA alone (no serving certificate), named `common_name`.
pub fn issue_ca(policy: &CertPolicy, common_name: &str) -> Result<Material, WebhookError> {
    issue_ca_for(policy, common_name, None)
}

/// A fresh CA alone, named `common_name` within the organisational unit `unit` when given: CAs
/// trusted side by side need subjects of their own, since clients look a certificate's issuer
/// up by name.
pub fn issue_ca_for(
    policy: &CertPolicy,
    common_name: &str,
    unit: Option<&str>,
) -> Result<Material, WebhookError> {
    let ca_key = KeyPair::generate().map_err(cert_err)?;
    let ca_not_after = after(policy.ca_lifetime);
    let ca_cert = ca_params(common_name, unit, ca_not_after)
        .map_err(cert_err)?
        .self_signed(&ca_key)
        .map_err(cert_err)?;
    Ok(Material {
        ca_pem: ca_cert.pem(),
        ca_key_pem: ca_key.serialize_pem(),
        cert_pem: String::new(),
        key_pem: String::new(),
        ca_not_after: ca_not_after.unix_timestamp(),
        cert_not_after: 0,
        sans: Vec::new(),
        generation: 0,
    })
}

/// Whether a CA has less than a certificate's lifetime left (a certificate issued now could not
/// live its full span).
pub fn ca_due(m: &Material, policy: &CertPolicy) -> bool {
    let secs = i64::try_from(policy.cert_lifetime.as_secs()).unwrap_or(i64::MAX);
    m.ca_not_after - now().unix_timestamp() < secs
}

/// Issues a new serving certificate under the CA already in `m`. The issuer's subject is read
/// from the stored CA certificate, so a CA made elsewhere (cert-manager's) issues as well as
/// the built-in one.
pub fn renew_serving(m: &mut Material, policy: &CertPolicy, sans: &[String]) -> Result<(), WebhookError> {
    renew(m, policy, sans, &[ExtendedKeyUsagePurpose::ServerAuth])
}

/// Issues a certificate for the members of a service, which serve their clients and also
/// connect to each other with it (Elasticsearch's transport layer requires both purposes).
pub fn renew_member(m: &mut Material, policy: &CertPolicy, sans: &[String]) -> Result<(), WebhookError> {
    renew(m, policy, sans, &[ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth])
}

fn renew(
    m: &mut Material,
    policy: &CertPolicy,
    sans: &[String],
    purposes: &[ExtendedKeyUsagePurpose],
) -> Result<(), WebhookError> {
    let ca_key = KeyPair::from_pem(&m.ca_key_pem).map_err(cert_err)?;
    let ca_not_after = OffsetDateTime::from_unix_timestamp(m.ca_not_after)
        .map_err(|e| WebhookError::Certificate(e.to_string()))?;
    let issuer = Issuer::from_ca_cert_pem(&m.ca_pem, ca_key).map_err(cert_err)?;
    let key = KeyPair::generate().map_err(cert_err)?;
    let mut params = CertificateParams::new(sans.to_vec()).map_err(cert_err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, sans.first().map_or("stateward-webhook", String::as_str));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = purposes.to_vec();
    // Backdated a little: API server and operator clocks may differ.
    params.not_before = now() - time::Duration::minutes(5);
    let cert_not_after = after(policy.cert_lifetime).min(ca_not_after);
    params.not_after = cert_not_after;
    let cert = params.signed_by(&key, &issuer).map_err(cert_err)?;
    m.cert_pem = cert.pem();
    m.key_pem = key.serialize_pem();
    m.cert_not_after = cert_not_after.unix_timestamp();
    m.sans = sans.to_vec();
    m.generation += 1;
    Ok(())
}

fn cert_err(e: rcgen::Error) -> WebhookError {
    WebhookError::Certificate(e.to_string())
}

/// What must happen to stored material, given the policy and the names to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Nothing,
    ServingCert,
    Everything,
}

/// Decides what is due: the CA when it has less than the serving lifetime left (so a new
/// serving certificate could not live its full span), the serving certificate under the
/// threshold or when the names changed.
pub fn due(m: Option<&Material>, policy: &CertPolicy, sans: &[String]) -> Due {
    let Some(m) = m else { return Due::Everything };
    let left = |t: i64| t - now().unix_timestamp();
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    if ca_due(m, policy) {
        return Due::Everything;
    }
    if left(m.cert_not_after) < secs(policy.renew_before) || m.sans != sans {
        return Due::ServingCert;
    }
    Due::Nothing
}

/// The CA half of a CA Secret as cert-manager writes it for an `isCA` Certificate: the CA's
/// own certificate and key in `tls.crt`/`tls.key` (expiry read from the certificate).
pub fn ca_from_cert_manager(secret: &Secret) -> Option<Material> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| data.get(k).and_then(|b| String::from_utf8(b.0.clone()).ok());
    let (ca_pem, ca_key_pem) = (text(TLS_CRT)?, text(TLS_KEY)?);
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).ok()?;
    let not_after = pem.parse_x509().ok()?.validity().not_after.timestamp();
    Some(Material {
        ca_pem,
        ca_key_pem,
        cert_pem: String::new(),
        key_pem: String::new(),
        ca_not_after: not_after,
        cert_not_after: 0,
        sans: Vec::new(),
        generation: 0,
    })
}

impl Material {
    /// Reads material from a Secret; `None` when a key or annotation is missing or unreadable.
    pub fn from_secret(secret: &Secret) -> Option<Material> {
        let data = secret.data.as_ref()?;
        let text = |k: &str| data.get(k).and_then(|b| String::from_utf8(b.0.clone()).ok());
        let ann = secret.metadata.annotations.as_ref()?;
        let num = |k: &str| ann.get(k).and_then(|v| v.parse::<i64>().ok());
        Some(Material {
            ca_pem: text(CA_CRT)?,
            ca_key_pem: text(CA_KEY)?,
            cert_pem: text(TLS_CRT)?,
            key_pem: text(TLS_KEY)?,
            ca_not_after: num(CA_NOT_AFTER)?,
            cert_not_after: num(CERT_NOT_AFTER)?,
            sans: ann.get(CERT_SANS).map(|s| s.split(',').map(str::to_string).collect()).unwrap_or_default(),
            generation: num(CERT_SERIAL).and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
        })
    }

    /// Reads a CA alone (`ca.crt`, `ca.key` and the CA's expiry annotation), as
    /// [`Self::ca_into_secret`] writes it.
    pub fn ca_from_secret(secret: &Secret) -> Option<Material> {
        let data = secret.data.as_ref()?;
        let text = |k: &str| data.get(k).and_then(|b| String::from_utf8(b.0.clone()).ok());
        let ann = secret.metadata.annotations.as_ref()?;
        Some(Material {
            ca_pem: text(CA_CRT)?,
            ca_key_pem: text(CA_KEY)?,
            cert_pem: String::new(),
            key_pem: String::new(),
            ca_not_after: ann.get(CA_NOT_AFTER).and_then(|v| v.parse::<i64>().ok())?,
            cert_not_after: 0,
            sans: Vec::new(),
            generation: 0,
        })
    }

    /// Writes the CA half into `secret` (type Opaque: it holds no serving pair).
    pub fn ca_into_secret(&self, mut secret: Secret) -> Secret {
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        secret.type_ = Some("Opaque".into());
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        data.insert(CA_CRT.into(), bytes(&self.ca_pem));
        data.insert(CA_KEY.into(), bytes(&self.ca_key_pem));
        let ann = secret.metadata.annotations.get_or_insert_with(BTreeMap::new);
        ann.insert(CA_NOT_AFTER.into(), self.ca_not_after.to_string());
        secret
    }

    /// Writes material into `secret`'s data and annotations (keeping its other metadata).
    pub fn into_secret(&self, mut secret: Secret) -> Secret {
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        secret.type_ = Some("kubernetes.io/tls".into());
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        data.insert(CA_CRT.into(), bytes(&self.ca_pem));
        data.insert(CA_KEY.into(), bytes(&self.ca_key_pem));
        data.insert(TLS_CRT.into(), bytes(&self.cert_pem));
        data.insert(TLS_KEY.into(), bytes(&self.key_pem));
        let ann = secret.metadata.annotations.get_or_insert_with(BTreeMap::new);
        ann.insert(CA_NOT_AFTER.into(), self.ca_not_after.to_string());
        ann.insert(CERT_NOT_AFTER.into(), self.cert_not_after.to_string());
        ann.insert(CERT_SANS.into(), self.sans.join(","));
        ann.insert(CERT_SERIAL.into(), self.generation.to_string());
        secret
    }

    /// The serving certificate and key as rustls wants them.
    pub fn serving(&self) -> Result<ServingCert, WebhookError> {
        ServingCert::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// The caBundle value for webhook client configs (base64 of the CA PEM).
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes())
    }
}

/// DNS names of the webhook Service, as the API server dials it.
pub fn service_sans(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_string(),
    ]
}

/// Keeps the webhook Secret current and the resolver serving what it holds.
pub struct BuiltinCa {
    pub secrets: Api<Secret>,
    pub name: String,
    pub policy: CertPolicy,
    pub sans: Vec<String>,
}

impl BuiltinCa {
    /// A store for Secret `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str, policy: CertPolicy, sans: Vec<String>) -> Self {
        Self { secrets: Api::namespaced(client, namespace), name: name.to_string(), policy, sans }
    }

    /// One pass: renew what is due (compare-and-swap on the Secret) and return what the
    /// Secret holds now (the caller serves it).
    pub async fn sync(&self) -> Result<Material, WebhookError> {
        for _ in 0..5 {
            let current = self
                .secrets
                .get_opt(&self.name)
                .await
                .map_err(WebhookError::kube("reading the webhook Secret"))?;
            let stored = current.as_ref().and_then(Material::from_secret);
            let next = match due(stored.as_ref(), &self.policy, &self.sans) {
                Due::Nothing => None,
                Due::ServingCert => {
                    let mut m =
                        stored.clone().ok_or_else(|| WebhookError::Certificate("no stored CA".into()))?;
                    renew_serving(&mut m, &self.policy, &self.sans)?;
                    Some(m)
                }
                Due::Everything => {
                    let mut m = issue_all(&self.policy, &self.sans)?;
                    m.generation += stored.as_ref().map_or(0, |s| s.generation);
                    Some(m)
                }
            };
            let material = match (next, current) {
                (None, _) => {
                    stored.ok_or_else(|| WebhookError::Certificate("stored material unreadable".into()))?
                }
                (Some(m), None) => {
                    let secret = m.into_secret(Secret {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            labels: Some(BTreeMap::from([(
                                "app.kubernetes.io/managed-by".to_string(),
                                "stateward".to_string(),
                            )])),
                            ..ObjectMeta::default()
                        },
                        ..Secret::default()
                    });
                    match self.secrets.create(&PostParams::default(), &secret).await {
                        Ok(_) => m,
                        Err(kube::Error::Api(s)) if s.code == 409 => continue,
                        Err(e) => return Err(WebhookError::kube("creating the webhook Secret")(e)),
                    }
                }
                (Some(m), Some(existing)) => {
                    // Replace carries the resourceVersion just read: a replica that renewed
                    // in between makes this a 409 and the loop reads its result instead.
                    let secret = m.into_secret(existing);
                    match self.secrets.replace(&self.name, &PostParams::default(), &secret).await {
                        Ok(_) => {
                            tracing::info!(
                                generation = m.generation,
                                not_after = m.cert_not_after,
                                "webhook serving certificate renewed"
                            );
                            m
                        }
                        Err(kube::Error::Api(s)) if s.code == 409 => continue,
                        Err(e) => return Err(WebhookError::kube("updating the webhook Secret")(e)),
                    }
                }
            };
            return Ok(material);
        }
        Err(WebhookError::Certificate("the webhook Secret kept changing under us".into()))
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn short() -> CertPolicy {
        CertPolicy {
            cert_lifetime: Duration::from_secs(10),
            renew_before: Duration::from_secs(5),
            ca_lifetime: Duration::from_secs(3600),
        }
    }

    #[test]
    fn renewal_keeps_the_ca_and_changes_the_serving_cert() {
        let sans = vec!["127.0.0.1".to_string()];
        let first = issue_all(&short(), &sans).expect("issue");
        let mut second = first.clone();
        renew_serving(&mut second, &short(), &sans).expect("renew");
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_ne!(first.cert_pem, second.cert_pem);
        assert_eq!(second.generation, first.generation + 1);
        assert!(second.serving().is_ok());
    }

    #[test]
    fn due_follows_the_threshold_and_the_names() {
        let sans = vec!["a.b.svc".to_string()];
        let mut m = issue_all(&short(), &sans).expect("issue");
        assert_eq!(due(None, &short(), &sans), Due::Everything);
        assert_eq!(due(Some(&m), &short(), &sans), Due::Nothing);
        assert_eq!(due(Some(&m), &short(), &["other".to_string()]), Due::ServingCert);
        m.cert_not_after = now().unix_timestamp() + 4;
        assert_eq!(due(Some(&m), &short(), &sans), Due::ServingCert);
        m.ca_not_after = now().unix_timestamp() + 9;
        assert_eq!(due(Some(&m), &short(), &sans), Due::Everything);
    }

    #[test]
    fn secret_round_trip() {
        let m = issue_all(&short(), &["x".to_string(), "y".to_string()]).expect("issue");
        let back = Material::from_secret(&m.into_secret(Secret::default())).expect("read back");
        assert_eq!(back, m);
    }
}

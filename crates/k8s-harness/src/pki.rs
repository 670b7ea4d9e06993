//! The cluster's certificates and keys (rcgen): a CA, the API server's serving certificate, a
//! client certificate for any identity, the service-account signing key pair, and kubeconfig
//! files. Keys are ECDSA P-256; every file is written into the run's work directory.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

use crate::{Error, Result};

/// Who a client certificate says the caller is: the user (CN) and at most one group (O; rcgen
/// writes one attribute of each type, and every built-in identity needs at most one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    user: String,
    group: Option<String>,
}

impl Identity {
    /// Any user, with an optional group.
    pub fn new(user: impl Into<String>, group: Option<&str>) -> Identity {
        Identity { user: user.into(), group: group.map(str::to_owned) }
    }

    /// Cluster admin: group `system:masters` (allowed everything, RBAC not consulted).
    pub fn admin() -> Identity {
        Identity::new("kproxy-admin", Some("system:masters"))
    }

    /// A kubelet: `system:node:NAME` in `system:nodes` (the Node authorizer's subject).
    pub fn node(name: &str) -> Identity {
        Identity::new(format!("system:node:{name}"), Some("system:nodes"))
    }

    /// A user without any group or binding: RBAC denies it everything but discovery.
    pub fn unprivileged(user: &str) -> Identity {
        Identity::new(user, None)
    }

    /// `system:kube-proxy`, which the default ClusterRoleBinding `system:node-proxier` grants
    /// what kube-proxy (and so kproxy) needs.
    pub fn kube_proxy() -> Identity {
        Identity::new("system:kube-proxy", None)
    }

    /// `system:kube-controller-manager` (default RBAC role of that name).
    pub fn controller_manager() -> Identity {
        Identity::new("system:kube-controller-manager", None)
    }

    /// `system:kube-scheduler` (default RBAC role of that name).
    pub fn scheduler() -> Identity {
        Identity::new("system:kube-scheduler", None)
    }

    /// The user name (certificate CN).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The group (certificate O), if any.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// A file-name-safe stem for this identity's files.
    pub fn file_stem(&self) -> String {
        let raw = match &self.group {
            Some(group) => format!("{}@{group}", self.user),
            None => self.user.clone(),
        };
        raw.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
    }
}

/// A client certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct ClientCredentials {
    /// The certificate, signed by the cluster CA.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    /// The certificate's file.
    pub cert_file: PathBuf,
    /// The key's file.
    pub key_file: PathBuf,
}

/// The names the API server's serving certificate holds besides `localhost`, 127.0.0.1 and
/// `kubernetes.default.svc.<cluster domain>` and its shorter forms.
#[derive(Debug, Clone)]
pub struct ServingNames {
    /// IP SANs (the bind address, the first service IP, ...).
    pub ips: Vec<IpAddr>,
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
}

/// The CA (which signs every certificate here), the serving certificate and the
/// service-account keys, as files in `dir`.
pub struct Pki {
    dir: PathBuf,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    /// One credential per identity, made on first use: a second certificate written over the
    /// first's files while a kubectl reads them pairs one's certificate with the other's key.
    clients: std::sync::Mutex<std::collections::HashMap<Identity, ClientCredentials>>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Pki {
    /// Generates the CA, the serving certificate and the service-account key pair into `dir`.
    pub fn generate(dir: &Path, serving: &ServingNames) -> Result<Pki> {
        fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(DnType::CommonName, "kproxy-k8s-harness-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_pem = ca.self_signed(&ca_key)?.pem();
        write(&dir.join("ca.crt"), &ca_pem)?;
        write(&dir.join("ca.key"), &ca_key.serialize_pem())?;
        let pki = Pki { dir: dir.to_path_buf(), ca_pem, issuer: Issuer::new(ca, ca_key), clients: Default::default() };

        let mut sans: Vec<SanType> = vec![IpAddr::from([127, 0, 0, 1])]
            .into_iter()
            .chain(serving.ips.iter().copied())
            .map(SanType::IpAddress)
            .collect();
        let domain = &serving.cluster_domain;
        for name in [
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            format!("kubernetes.default.svc.{domain}"),
        ] {
            sans.push(SanType::DnsName(name.try_into()?));
        }
        sans.dedup();
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &pki.issuer)?;
        write(&pki.serving_cert_file(), &cert.pem())?;
        write(&pki.serving_key_file(), &key.serialize_pem())?;

        let sa = KeyPair::generate()?;
        write(&pki.service_account_key_file(), &sa.serialize_pem())?;
        write(&pki.service_account_pub_file(), &sa.public_key_pem())?;
        Ok(pki)
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// `ca.crt`.
    pub fn ca_cert_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `ca.key` (kube-controller-manager's cluster signing key).
    pub fn ca_key_file(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The API server's serving certificate.
    pub fn serving_cert_file(&self) -> PathBuf {
        self.dir.join("apiserver.crt")
    }

    /// The API server's serving key.
    pub fn serving_key_file(&self) -> PathBuf {
        self.dir.join("apiserver.key")
    }

    /// The service-account signing key (private; ES256).
    pub fn service_account_key_file(&self) -> PathBuf {
        self.dir.join("sa.key")
    }

    /// The service-account verification key (public).
    pub fn service_account_pub_file(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }

    /// The client certificate for `identity`, written to `<dir>/clients/<stem>.{crt,key}` when first
    /// asked for; later calls return the same one.
    pub fn client(&self, identity: &Identity) -> Result<ClientCredentials> {
        let mut clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(creds) = clients.get(identity) {
            return Ok(creds.clone());
        }
        let creds = self.new_client(identity)?;
        clients.insert(identity.clone(), creds.clone());
        Ok(creds)
    }

    fn new_client(&self, identity: &Identity) -> Result<ClientCredentials> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, identity.user());
        if let Some(group) = identity.group() {
            params.distinguished_name.push(DnType::OrganizationName, group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert_pem = params.signed_by(&key, &self.issuer)?.pem();
        let key_pem = key.serialize_pem();
        let clients = self.dir.join("clients");
        fs::create_dir_all(&clients).map_err(|e| Error::io(format!("creating {}", clients.display()), e))?;
        let stem = identity.file_stem();
        let cert_file = clients.join(format!("{stem}.crt"));
        let key_file = clients.join(format!("{stem}.key"));
        write(&cert_file, &cert_pem)?;
        write(&key_file, &key_pem)?;
        Ok(ClientCredentials { cert_pem, key_pem, cert_file, key_file })
    }

    /// Writes a kubeconfig for `identity` against `server` (an `https://` URL) to `path`; its
    /// certificates are files beside the PKI, so it lives as long as the run's work directory.
    pub fn write_kubeconfig(&self, identity: &Identity, server: &str, path: &Path) -> Result<()> {
        let creds = self.client(identity)?;
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kproxy-harness", "cluster": {
                "server": server,
                "certificate-authority": self.ca_cert_file(),
            }}],
            "users": [{"name": identity.user(), "user": {
                "client-certificate": creds.cert_file,
                "client-key": creds.key_file,
            }}],
            "contexts": [{"name": "kproxy-harness", "context": {"cluster": "kproxy-harness", "user": identity.user()}}],
            "current-context": "kproxy-harness",
        });
        let text = serde_json::to_string_pretty(&config).map_err(|e| Error::io("encoding a kubeconfig", e.into()))?;
        write(path, &text)
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_file_stems_are_file_name_safe_and_distinct() {
        let stems: Vec<String> = [Identity::admin(), Identity::node("n1"), Identity::unprivileged("bob")]
            .iter()
            .map(Identity::file_stem)
            .collect();
        assert_eq!(stems, ["kproxy-admin_system_masters", "system_node_n1_system_nodes", "bob"]);
    }

    #[test]
    fn generated_pki_writes_every_file_and_signs_client_certificates() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let pki = Pki::generate(
            dir.path(),
            &ServingNames { ips: vec![IpAddr::from([198, 18, 0, 2])], cluster_domain: "cluster.local".into() },
        )?;
        for file in [
            pki.ca_cert_file(),
            pki.ca_key_file(),
            pki.serving_cert_file(),
            pki.serving_key_file(),
            pki.service_account_key_file(),
            pki.service_account_pub_file(),
        ] {
            assert!(file.is_file(), "{} missing", file.display());
        }
        let creds = pki.client(&Identity::node("n1"))?;
        assert!(creds.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(creds.key_pem.contains("PRIVATE KEY"));
        Ok(())
    }
}

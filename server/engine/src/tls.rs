//! TLS trust, shared by the engine (`https://` includes) and the CLI (`https://` engines):
//! the system's roots plus PEM files of private CAs, and PEM parsing with errors that say what
//! is wrong with the file.

use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject;

/// The certificates in a PEM file's contents; an error when there is none.
pub fn certificates_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate (`-----BEGIN CERTIFICATE-----`) in it".to_owned());
    }
    Ok(certs)
}

/// Reads a PEM file of trusted roots (a private CA), with errors naming it.
pub fn read_certificates(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    certificates_from_pem(&pem).map_err(|e| format!("{}: {e}", path.display()))
}

/// The roots to verify servers against: the system's (as `rustls-native-certs` finds them:
/// `SSL_CERT_FILE`, `SSL_CERT_DIR` or the distribution's store) and `extra`. An error when
/// there is none at all.
pub fn trust_roots(extra: &[CertificateDer<'static>]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    if !native.errors.is_empty() {
        tracing::debug!(errors = ?native.errors, "some system certificates could not be read");
    }
    roots.add_parsable_certificates(native.certs);
    for cert in extra {
        roots
            .add(cert.clone())
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(
            "no trusted certificate: the system has none (install ca-certificates, or set \
             SSL_CERT_FILE) and no CA file was given"
                .to_owned(),
        );
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_certificates() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let pem = format!("{}{}", cert.pem(), cert.pem());
        assert_eq!(certificates_from_pem(pem.as_bytes()).unwrap().len(), 2);
        assert!(
            certificates_from_pem(b"hello")
                .unwrap_err()
                .contains("no PEM")
        );
        assert!(
            certificates_from_pem(key.serialize_pem().as_bytes())
                .unwrap_err()
                .contains("no PEM")
        );
    }
}

//! README.md's reference section is what the provider serves (TRELLIS_BLESS=1 rewrites it).

use trellis_provider_aws::{AwsProvider, reference};

#[test]
fn the_readme_reference_matches_the_schemas() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let want = reference::markdown(&AwsProvider::default());
    let start = readme
        .find(reference::START)
        .expect("README has the reference start marker");
    let end = readme
        .find(reference::END)
        .expect("README has the reference end marker")
        + reference::END.len()
        + 1;
    let have = readme.get(start..end.min(readme.len())).unwrap_or("");
    if have != want {
        if std::env::var_os("TRELLIS_BLESS").is_some() {
            let fresh = format!(
                "{}{want}{}",
                &readme[..start],
                readme.get(end..).unwrap_or("")
            );
            std::fs::write(&path, fresh).expect("rewrite README.md");
            return;
        }
        panic!(
            "plugins/aws/README.md's reference is stale: TRELLIS_BLESS=1 cargo test -p trellis-provider-aws reference"
        );
    }
}

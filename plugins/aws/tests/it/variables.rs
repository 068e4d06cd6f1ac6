//! Custom variable types `aws/region` and `aws/ec2/instanceSize`.

use serde_json::json;
use trellis_plugin_sdk::Value;
use trellis_plugin_sdk::testing::Harness;
use trellis_provider_aws::AwsProvider;

use crate::support::{boto, harness, moto};

#[tokio::test]
async fn regions_are_offered_by_code_with_their_location() {
    // No AWS call is made: the options come without moto or credentials.
    let h = Harness::provider(AwsProvider::default())
        .await
        .expect("harness");
    let options = h.variable_options("aws/region").await.expect("options");
    let find = |code: &str| options.iter().find(|o| o.label == code);
    let ireland = find("eu-west-1").expect("eu-west-1");
    assert_eq!(ireland.value, Value::from("eu-west-1"));
    assert_eq!(ireland.description, "Europe (Ireland)");
    assert_eq!(
        find("us-east-1").map(|o| o.description.as_str()),
        Some("US East (N. Virginia)")
    );
    assert_eq!(
        find("cn-north-1").map(|o| o.description.as_str()),
        Some("China (Beijing)")
    );
    assert_eq!(
        find("us-gov-west-1").map(|o| o.description.as_str()),
        Some("AWS GovCloud (US-West)")
    );
    assert!(find("mx-central-1").is_some());
    assert!(find("eu-west-9").is_none());
    assert!(
        options
            .iter()
            .all(|o| o.value == Value::from(o.label.as_str())),
        "the value of every region is its code"
    );

    let manifest = h.manifest().await.expect("manifest");
    let types: Vec<&str> = manifest
        .custom_variable_types
        .iter()
        .map(|t| t.r#type.as_str())
        .collect();
    assert_eq!(types, ["aws/region", "aws/ec2/instanceSize"]);
}

#[tokio::test]
async fn instance_sizes_match_what_ec2_reports() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let options = h
        .variable_options("aws/ec2/instanceSize")
        .await
        .expect("options");
    let micro = options
        .iter()
        .find(|o| o.label == "t3.micro")
        .expect("t3.micro, the specification's default");
    assert_eq!(micro.value, Value::from("t3.micro"));
    assert!(
        micro.description.starts_with("2 vCPUs, 1 GiB memory"),
        "{}",
        micro.description
    );
    for name in [
        "t3.nano",
        "t4g.2xlarge",
        "m5.24xlarge",
        "m6i.large",
        "m7g.medium",
        "c5.9xlarge",
        "c6i.32xlarge",
        "c7g.16xlarge",
        "r5.large",
        "r6i.24xlarge",
        "r7g.xlarge",
    ] {
        assert!(options.iter().any(|o| o.label == name), "{name}");
    }
    assert!(!options.iter().any(|o| o.label.ends_with(".metal")));

    // moto carries EC2's own instance type data: every option's vCPUs and memory agree.
    let names: Vec<&str> = options.iter().map(|o| o.label.as_str()).collect();
    let mut reported = std::collections::HashMap::new();
    for chunk in names.chunks(100) {
        let out = boto(
            m,
            "ec2",
            "describe_instance_types",
            json!({ "InstanceTypes": chunk }),
        )
        .expect("describe_instance_types");
        for t in out["InstanceTypes"].as_array().expect("types") {
            let name = t["InstanceType"].as_str().expect("name").to_owned();
            let cpus = t["VCpuInfo"]["DefaultVCpus"].as_u64().expect("vcpus");
            let mib = t["MemoryInfo"]["SizeInMiB"].as_u64().expect("memory");
            reported.insert(name, (cpus, mib));
        }
    }
    for o in &options {
        let (cpus, mib) = reported
            .get(&o.label)
            .unwrap_or_else(|| panic!("EC2 does not know {}", o.label));
        let memory = if mib.is_multiple_of(1024) {
            format!("{} GiB", mib / 1024)
        } else {
            format!("{} GiB", *mib as f64 / 1024.0)
        };
        let plural = if *cpus == 1 { "" } else { "s" };
        let expected = format!("{cpus} vCPU{plural}, {memory} memory (");
        assert!(
            o.description.starts_with(&expected),
            "{}: {} (EC2: {expected})",
            o.label,
            o.description
        );
    }
}

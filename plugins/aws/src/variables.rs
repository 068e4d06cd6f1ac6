//! Custom variable types `aws/region` and `aws/ec2/instanceSize`.
//!
//! Both lists are data as of 2026, compiled into the plugin: options are answered without
//! any call to AWS (a variable's options are needed to validate a blueprint, often with no
//! credentials at hand), so a region or instance type AWS adds later appears only with a
//! new release of the plugin.

use trellis_plugin_sdk::prelude::*;

/// `aws/region`: the regions of the commercial (`aws`), China (`aws-cn`) and GovCloud
/// (`aws-us-gov`) partitions. The label and the value are the region code.
pub struct RegionType;

/// (code, location), commercial, then China, then GovCloud, each by code.
pub const REGIONS: &[(&str, &str)] = &[
    ("af-south-1", "Africa (Cape Town)"),
    ("ap-east-1", "Asia Pacific (Hong Kong)"),
    ("ap-east-2", "Asia Pacific (Taipei)"),
    ("ap-northeast-1", "Asia Pacific (Tokyo)"),
    ("ap-northeast-2", "Asia Pacific (Seoul)"),
    ("ap-northeast-3", "Asia Pacific (Osaka)"),
    ("ap-south-1", "Asia Pacific (Mumbai)"),
    ("ap-south-2", "Asia Pacific (Hyderabad)"),
    ("ap-southeast-1", "Asia Pacific (Singapore)"),
    ("ap-southeast-2", "Asia Pacific (Sydney)"),
    ("ap-southeast-3", "Asia Pacific (Jakarta)"),
    ("ap-southeast-4", "Asia Pacific (Melbourne)"),
    ("ap-southeast-5", "Asia Pacific (Malaysia)"),
    ("ap-southeast-6", "Asia Pacific (New Zealand)"),
    ("ap-southeast-7", "Asia Pacific (Thailand)"),
    ("ca-central-1", "Canada (Central)"),
    ("ca-west-1", "Canada West (Calgary)"),
    ("eu-central-1", "Europe (Frankfurt)"),
    ("eu-central-2", "Europe (Zurich)"),
    ("eu-north-1", "Europe (Stockholm)"),
    ("eu-south-1", "Europe (Milan)"),
    ("eu-south-2", "Europe (Spain)"),
    ("eu-west-1", "Europe (Ireland)"),
    ("eu-west-2", "Europe (London)"),
    ("eu-west-3", "Europe (Paris)"),
    ("il-central-1", "Israel (Tel Aviv)"),
    ("me-central-1", "Middle East (UAE)"),
    ("me-south-1", "Middle East (Bahrain)"),
    ("mx-central-1", "Mexico (Central)"),
    ("sa-east-1", "South America (São Paulo)"),
    ("us-east-1", "US East (N. Virginia)"),
    ("us-east-2", "US East (Ohio)"),
    ("us-west-1", "US West (N. California)"),
    ("us-west-2", "US West (Oregon)"),
    ("cn-north-1", "China (Beijing)"),
    ("cn-northwest-1", "China (Ningxia)"),
    ("us-gov-east-1", "AWS GovCloud (US-East)"),
    ("us-gov-west-1", "AWS GovCloud (US-West)"),
];

#[async_trait]
impl CustomVariableType for RegionType {
    fn type_name(&self) -> &str {
        "aws/region"
    }

    fn description(&self) -> &str {
        "An AWS region of the commercial, China or GovCloud partition, by code (`eu-west-1`); the value is the code"
    }

    async fn options(&self, _ctx: &Context) -> Result<Vec<VariableOption>> {
        Ok(REGIONS
            .iter()
            .map(|(code, location)| VariableOption::new(*code, *code).describe(*location))
            .collect())
    }
}

/// `aws/ec2/instanceSize`: current-generation EC2 instance types of the burstable (t),
/// general purpose (m), compute optimised (c) and memory optimised (r) families, every
/// size but bare metal. The label and the value are the type name (`t3.micro`).
pub struct InstanceSizeType;

const NITRO: &[&str] = &[
    "large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
];
const NITRO_32: &[&str] = &[
    "large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
    "32xlarge",
];
const NITRO_48: &[&str] = &[
    "large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
    "48xlarge",
];
const GRAVITON: &[&str] = &[
    "medium", "large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge",
];
const C5: &[&str] = &[
    "large", "xlarge", "2xlarge", "4xlarge", "9xlarge", "12xlarge", "18xlarge", "24xlarge",
];

/// (family, what it is, GiB of memory per vCPU, sizes): every m, c and r family here has a
/// fixed memory per vCPU, and `medium` is 1 vCPU, `large` 2, `xlarge` 4 and `Nxlarge` 4 × N.
type Family = (&'static str, &'static str, u32, &'static [&'static str]);

const FAMILIES: &[Family] = &[
    ("m5", "general purpose, Intel Xeon", 4, NITRO),
    ("m6i", "general purpose, Intel Xeon", 4, NITRO_32),
    ("m6g", "general purpose, Graviton2 (arm64)", 4, GRAVITON),
    ("m7g", "general purpose, Graviton3 (arm64)", 4, GRAVITON),
    ("m7i", "general purpose, Intel Xeon", 4, NITRO_48),
    ("c5", "compute optimised, Intel Xeon", 2, C5),
    ("c6i", "compute optimised, Intel Xeon", 2, NITRO_32),
    ("c6g", "compute optimised, Graviton2 (arm64)", 2, GRAVITON),
    ("c7g", "compute optimised, Graviton3 (arm64)", 2, GRAVITON),
    ("c7i", "compute optimised, Intel Xeon", 2, NITRO_48),
    ("r5", "memory optimised, Intel Xeon", 8, NITRO),
    ("r6i", "memory optimised, Intel Xeon", 8, NITRO_32),
    ("r6g", "memory optimised, Graviton2 (arm64)", 8, GRAVITON),
    ("r7g", "memory optimised, Graviton3 (arm64)", 8, GRAVITON),
    ("r7i", "memory optimised, Intel Xeon", 8, NITRO_48),
];

/// Burstable sizes, the same for t3, t3a and t4g: (size, vCPUs, memory in MiB).
const BURSTABLE: &[(&str, u32, u32)] = &[
    ("nano", 2, 512),
    ("micro", 2, 1024),
    ("small", 2, 2048),
    ("medium", 2, 4096),
    ("large", 2, 8192),
    ("xlarge", 4, 16384),
    ("2xlarge", 8, 32768),
];

const BURSTABLE_FAMILIES: &[(&str, &str)] = &[
    ("t3", "burstable, Intel Xeon"),
    ("t3a", "burstable, AMD EPYC"),
    ("t4g", "burstable, Graviton2 (arm64)"),
];

/// vCPUs of a size of the m, c and r families; None for a size these families lack.
fn vcpus(size: &str) -> Option<u32> {
    match size {
        "medium" => Some(1),
        "large" => Some(2),
        "xlarge" => Some(4),
        _ => size
            .strip_suffix("xlarge")
            .and_then(|n| n.parse::<u32>().ok())
            .map(|n| n * 4),
    }
}

/// `0.5 GiB`, `8 GiB`.
fn memory(mib: u32) -> String {
    if mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{} GiB", f64::from(mib) / 1024.0)
    }
}

/// Every instance type: (name, vCPUs, memory in MiB, what it is), burstable first, then
/// general purpose, compute and memory optimised, each family from small to large.
pub fn instance_types() -> Vec<(String, u32, u32, &'static str)> {
    let mut out = Vec::new();
    for (family, what) in BURSTABLE_FAMILIES {
        for (size, cpus, mib) in BURSTABLE {
            out.push((format!("{family}.{size}"), *cpus, *mib, *what));
        }
    }
    for (family, what, gib_per_vcpu, sizes) in FAMILIES {
        for size in *sizes {
            if let Some(cpus) = vcpus(size) {
                out.push((
                    format!("{family}.{size}"),
                    cpus,
                    cpus * gib_per_vcpu * 1024,
                    *what,
                ));
            }
        }
    }
    out
}

#[async_trait]
impl CustomVariableType for InstanceSizeType {
    fn type_name(&self) -> &str {
        "aws/ec2/instanceSize"
    }

    fn description(&self) -> &str {
        "A current-generation EC2 instance type (t3, t3a, t4g, m5, m6i, m6g, m7g, m7i, c5, c6i, c6g, c7g, c7i, r5, r6i, r6g, r7g, r7i; no bare metal) by name (`t3.micro`); the value is the name"
    }

    async fn options(&self, _ctx: &Context) -> Result<Vec<VariableOption>> {
        Ok(instance_types()
            .into_iter()
            .map(|(name, cpus, mib, what)| {
                let plural = if cpus == 1 { "" } else { "s" };
                let d = format!("{cpus} vCPU{plural}, {} memory ({what})", memory(mib));
                VariableOption::new(name.clone(), name).describe(d)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_unique_valid_codes() {
        let mut codes: Vec<&str> = REGIONS.iter().map(|(c, _)| *c).collect();
        assert!(codes.iter().all(|c| crate::config::valid_region(c)));
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), REGIONS.len());
    }

    #[test]
    fn instance_types_have_their_sizes() {
        let all = instance_types();
        let find = |n: &str| all.iter().find(|t| t.0 == n).map(|t| (t.1, t.2));
        assert_eq!(find("t3.nano"), Some((2, 512)));
        assert_eq!(find("t4g.2xlarge"), Some((8, 32 * 1024)));
        assert_eq!(find("m7g.medium"), Some((1, 4 * 1024)));
        assert_eq!(find("c5.9xlarge"), Some((36, 72 * 1024)));
        assert_eq!(find("r6i.32xlarge"), Some((128, 1024 * 1024)));
        assert_eq!(find("m5.medium"), None);
        assert_eq!(memory(512), "0.5 GiB");
        assert_eq!(memory(8192), "8 GiB");
        let mut names: Vec<&str> = all.iter().map(|t| t.0.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}

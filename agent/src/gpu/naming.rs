//! Mapping of NVML marketing names to the short GPU type strings the scheduler matches on
//! ("A100" matches "A100-40G" by family prefix, see `scheduler::gpu_type_matches`).

/// Vendor and product-line words that carry no model information.
const NOISE_WORDS: &[&str] = &["NVIDIA", "TESLA", "GEFORCE", "QUADRO"];

/// Families sold in several memory sizes: their type always carries the size so that
/// "A100-80G" and "A100-40G" are told apart even when NVML's name omits it ("NVIDIA H100 PCIe").
const MULTI_SIZE_FAMILIES: &[&str] = &[
    "A100", "A800", "H100", "H800", "H200", "H20", "GH200", "B100", "B200", "V100", "P100",
];

/// Words that introduce a model name that follows as a second word ("RTX 4090", "RTX A6000").
const SERIES_WORDS: &[&str] = &["RTX", "GTX", "TITAN"];

/// Turns an NVML device name into a GPU type:
///
/// 1. vendor words (NVIDIA, Tesla, GeForce, Quadro) are dropped and the rest is split on
///    spaces and dashes;
/// 2. the first word is the model, joined by a dash to the next word for the RTX/GTX/TITAN
///    series ("GeForce RTX 4090" → "RTX-4090");
/// 3. a size word such as "80GB" anywhere in the name becomes a "-80G" suffix; without one,
///    families sold in several sizes (A100, H100, H200, V100, ...) get the size from
///    `memory_bytes`, rounded up to whole GiB (NVML reports slightly less than the label,
///    e.g. 143771 MiB for the 141 GB H200);
/// 4. form-factor words (SXM4, PCIe, HBM3, NVL, ...) are ignored.
///
/// Examples: "NVIDIA A100-SXM4-40GB" → "A100-40G", "NVIDIA H200" (143771 MiB) → "H200-141G",
/// "Tesla T4" → "T4", "NVIDIA A40" → "A40".
pub fn gpu_type_from_name(name: &str, memory_bytes: u64) -> String {
    let words: Vec<String> = name
        .split(|c: char| c.is_whitespace() || c == '-')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .filter(|w| !NOISE_WORDS.contains(&w.as_str()))
        .collect();
    let size_in_name = words.iter().find_map(|w| size_word(w));
    let mut model_words = words.iter().filter(|w| size_word(w).is_none());
    let Some(first) = model_words.next() else {
        return name.trim().to_string();
    };
    let mut model = first.clone();
    if SERIES_WORDS.contains(&first.as_str()) {
        if let Some(next) = model_words.next() {
            model = format!("{first}-{next}");
        }
    }
    let size = size_in_name.or_else(|| {
        (MULTI_SIZE_FAMILIES.contains(&model.as_str()) && memory_bytes > 0)
            .then(|| memory_bytes.div_ceil(1 << 30))
    });
    match size {
        Some(gb) => format!("{model}-{gb}G"),
        None => model,
    }
}

/// "80GB" → 80.
fn size_word(w: &str) -> Option<u64> {
    let digits = w.strip_suffix("GB")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn nvml_names_map_to_scheduler_types() {
        let cases: &[(&str, u64, &str)] = &[
            ("NVIDIA A100-SXM4-40GB", 40960 * MIB, "A100-40G"),
            ("NVIDIA A100-SXM4-80GB", 81920 * MIB, "A100-80G"),
            ("NVIDIA A100 80GB PCIe", 81920 * MIB, "A100-80G"),
            ("NVIDIA A100-PCIE-40GB", 40960 * MIB, "A100-40G"),
            ("NVIDIA H100 80GB HBM3", 81559 * MIB, "H100-80G"),
            ("NVIDIA H100 PCIe", 81559 * MIB, "H100-80G"),
            ("NVIDIA H100 NVL", 95830 * MIB, "H100-94G"),
            ("NVIDIA H200", 143771 * MIB, "H200-141G"),
            ("Tesla V100-SXM2-16GB", 16160 * MIB, "V100-16G"),
            ("Tesla V100-PCIE-32GB", 32510 * MIB, "V100-32G"),
            ("Tesla T4", 15360 * MIB, "T4"),
            ("NVIDIA A40", 46068 * MIB, "A40"),
            ("NVIDIA L40S", 46068 * MIB, "L40S"),
            ("NVIDIA GeForce RTX 4090", 24564 * MIB, "RTX-4090"),
            ("NVIDIA RTX A6000", 49140 * MIB, "RTX-A6000"),
        ];
        for (name, mem, want) in cases {
            assert_eq!(gpu_type_from_name(name, *mem), *want, "{name}");
        }
    }

    #[test]
    fn odd_names_do_not_panic() {
        assert_eq!(gpu_type_from_name("", 0), "");
        assert_eq!(gpu_type_from_name("NVIDIA", 0), "NVIDIA");
        assert_eq!(gpu_type_from_name("NVIDIA H100", 0), "H100");
    }
}

//! CPU lists as the kernel writes them (`0-3,8,10-11`, in `cpulist`, `cpus_allowed_list`,
//! `devices/system/cpu/possible`) and as the config takes them.

/// The most CPUs a list yields: bounds what a malformed list can allocate.
const MAX_RANGE: usize = 65_536;

/// The CPUs of a list, in its order; malformed parts (`x`, `5-3`) are skipped.
pub fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    if a <= b {
                        cpus.extend(a..=b.min(a.saturating_add(MAX_RANGE - 1)));
                    }
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    cpus.truncate(MAX_RANGE);
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(" 2 , 4-5 "), vec![2, 4, 5]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("x,5-3,1-y,7"), vec![7], "malformed parts are skipped");
        assert_eq!(parse_cpu_list(&format!("0-{}", u64::MAX)).len(), MAX_RANGE, "a huge range is bounded");
        assert_eq!(parse_cpu_list(&"0-65535,".repeat(64)).len(), MAX_RANGE, "and so is a long list");
    }
}

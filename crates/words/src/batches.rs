//! Batch sizes as users type them for a bench run: a list such as `4,8,16`.

use vramlab_core::plan::config::MAX_BATCH;
use vramlab_core::sweep::BatchPlan;

/// A bench run's batch list as users type it: "4,8,16"; every entry must be a positive
/// integer no larger than the planner plans.
pub fn batch_list(s: &str) -> Result<BatchPlan, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let b: u64 = part
            .parse()
            .map_err(|_| format!("batch list: `{part}` is not a whole number"))?;
        if b == 0 {
            return Err("batch list: batch sizes start at 1".into());
        }
        if b > MAX_BATCH {
            return Err(format!(
                "batch list: {b} is above the largest batch vramlab plans ({})",
                MAX_BATCH
            ));
        }
        out.push(b);
    }
    if out.is_empty() {
        return Err("batch list: give at least one batch size, e.g. 4,8,16".into());
    }
    Ok(BatchPlan::List(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_parsing_names_the_problem() {
        assert_eq!(batch_list("4, 8,16"), Ok(BatchPlan::List(vec![4, 8, 16])));
        assert!(
            batch_list("0")
                .expect_err("an error")
                .contains("start at 1")
        );
        assert!(batch_list("4,x").expect_err("an error").contains("`x`"));
        assert!(
            batch_list("")
                .expect_err("an error")
                .contains("at least one")
        );
        assert!(
            batch_list("99999999999")
                .expect_err("an error")
                .contains("largest")
        );
    }
}

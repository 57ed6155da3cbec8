//! The results of a run: a gang's parts ending node by node, and results that are uploading,
//! stored or given up.

use async_trait::async_trait;

use super::*;

/// Parts of a run that ended, and the results a run leaves.
#[async_trait]
pub trait RunResults: Send + Sync {
    /// Gives up results still uploading from tasks that ended before `ended_before` (their
    /// node never sent them: it is gone, or its disk was wiped), with a line in each timeline;
    /// returns how many.
    async fn expire_uploading_results(
        &self,
        ended_before: i64,
        message: &str,
        now: i64,
    ) -> StoreResult<u64>;
    /// Records that every worker `node` ran of an attempt succeeded: a gang spanning nodes ends
    /// when each node's part has. Returns the attempt's parts ended so far, this one with them,
    /// or `None` when this part had ended already (a repeated report changes nothing). Parts
    /// of one attempt are recorded one at a time, so exactly one report sees the last.
    async fn end_part(
        &self,
        task_id: &str,
        attempt: i64,
        part: &PartEnded,
    ) -> StoreResult<Option<Vec<PartEnded>>>;
    /// The parts of an attempt that have ended (see [`RunResults::end_part`]).
    async fn ended_parts(&self, task_id: &str, attempt: i64) -> StoreResult<Vec<PartEnded>>;
    /// `node`'s part of an attempt keeps no results any more (stored, or given up).
    async fn part_results_settled(
        &self,
        task_id: &str,
        attempt: i64,
        node: &str,
    ) -> StoreResult<()>;
    /// Settles the results of a task's last attempt that were uploading (`None`: stored,
    /// `Some("lost")`), with a line in its timeline. False when they were not uploading.
    async fn settle_results(
        &self,
        task_id: &str,
        attempt: i64,
        results: Option<&str>,
        message: &str,
        now: i64,
    ) -> StoreResult<bool>;
}

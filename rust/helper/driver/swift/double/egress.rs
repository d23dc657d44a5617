//! The EGRESS policy and events sink of VMs being booted through the
//! double, by VM id. On a Mac the policy never crosses the bridge: the
//! guest's frames come back to the helper's own stack on `network_fd`. The
//! double's namespace driver enforces it on its own tun instead, inside
//! this process, so the helper hands it over here for the length of the
//! boot call.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::helper::netstack::events::Events;
use crate::netpolicy::NetworkPolicy;

type Egress = (NetworkPolicy, Arc<Events>);

static PENDING: Mutex<Option<HashMap<String, Egress>>> = Mutex::new(None);

/// Leaves VM `id`'s policy for the boot that follows.
pub fn hand_over(id: &str, egress: Egress) {
    PENDING.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_default().insert(id.to_owned(), egress);
}

/// Takes VM `id`'s policy, if one was left (the double's boot; the
/// helper again after it, so a refused boot leaves nothing behind).
pub fn take(id: &str) -> Option<Egress> {
    PENDING.lock().unwrap_or_else(PoisonError::into_inner).as_mut()?.remove(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_taken_once_and_only_by_its_vm() {
        hand_over("egress-a", (NetworkPolicy::default(), Arc::new(Events::default())));
        assert!(take("egress-b").is_none());
        assert!(take("egress-a").is_some());
        assert!(take("egress-a").is_none());
    }
}

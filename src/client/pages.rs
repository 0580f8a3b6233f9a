//! Paginated lists: every list the controller and its commands make that grows with the fleet
//! (Nodes, Pods, HyperNodes and our other scheduler objects) goes page by page (a large fleet is
//! never one response held whole), through [`each_page`]; the few ResourceFlavors and Slurm
//! ConfigMaps are listed at once.
//!
//! Owns: the continue-token loop. Never decides what a page's items mean.

use std::future::Future;

use kube::api::{ListParams, ObjectList};

/// Objects per page where the caller has no reason to choose (the API server's own suggestion
/// for clients that page; the node watch pages smaller, see [`crate::node::store::NODE_PAGE`]).
pub(crate) const PAGE: u32 = 500;

/// Hand every page `fetch` returns for `params` (its limit set to `limit`) to `each`, following
/// the continue token until the list ends. `fetch` is `|p| async move { api.list(&p).await }`
/// or `list_metadata` the same way.
pub(crate) async fn each_page<T, E, F, Fut>(
    params: ListParams,
    limit: u32,
    mut fetch: F,
    mut each: impl FnMut(Vec<T>),
) -> Result<(), E>
where
    T: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<T>, E>>,
{
    let mut params = params.limit(limit);
    loop {
        let page = fetch(params.clone()).await?;
        each(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ListMeta;

    fn page(items: Vec<u32>, next: Option<&str>) -> ObjectList<u32> {
        ObjectList {
            types: Default::default(),
            metadata: ListMeta {
                continue_: next.map(String::from),
                ..ListMeta::default()
            },
            items,
        }
    }

    #[tokio::test]
    async fn follows_the_continue_token_until_the_list_ends() {
        let mut asked: Vec<(Option<u32>, Option<String>)> = Vec::new();
        let mut seen = Vec::new();
        let r: Result<(), ()> = each_page(
            ListParams::default().labels("a=b"),
            2,
            |p| {
                asked.push((p.limit, p.continue_token.clone()));
                let answer = match p.continue_token.as_deref() {
                    None => page(vec![1, 2], Some("t1")),
                    Some("t1") => page(vec![3, 4], Some("t2")),
                    // An empty token ends the list as an absent one does.
                    _ => page(vec![5], Some("")),
                };
                async move { Ok(answer) }
            },
            |items| seen.extend(items),
        )
        .await;
        assert_eq!(r, Ok(()));
        assert_eq!(seen, vec![1, 2, 3, 4, 5]);
        assert_eq!(
            asked,
            vec![
                (Some(2), None),
                (Some(2), Some("t1".into())),
                (Some(2), Some("t2".into()))
            ]
        );
    }

    #[tokio::test]
    async fn an_error_ends_the_walk_with_it() {
        let mut seen = Vec::new();
        let r: Result<(), &str> = each_page(
            ListParams::default(),
            PAGE,
            |p| {
                let answer = match p.continue_token {
                    None => Ok(page(vec![1], Some("t1"))),
                    Some(_) => Err("gone"),
                };
                async move { answer }
            },
            |items| seen.extend(items),
        )
        .await;
        assert_eq!(r, Err("gone"));
        assert_eq!(seen, vec![1]);
    }
}

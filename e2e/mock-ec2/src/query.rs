//! What EC2's paginated `Describe*` calls share, as the API Reference documents them for each:
//! `Version` required, `MaxResults` within the call's range, an opaque `NextToken`, `Filter.N`
//! limited to the call's names (wildcards in values), `DryRun`, and `UnauthorizedOperation`
//! naming the action. Used by [`crate::reservations`] and [`crate::capacity_blocks`].

use axum::http::StatusCode;

use super::{ApiError, decode_token, encode_token, indexed, xml_escape};

/// `Version` is required on every call.
pub(crate) fn require_version(params: &[(String, String)]) -> Result<(), ApiError> {
    match get(params, "Version") {
        Some(_) => Ok(()),
        None => Err(ApiError::bad(
            "MissingParameter",
            "The request must contain the parameter Version",
        )),
    }
}

pub(crate) fn get<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(p, _)| p == key)
        .map(|(_, v)| v.as_str())
}

/// `MaxResults` within `min..=max` (`default` when absent).
pub(crate) fn page_size(
    params: &[(String, String)],
    min: usize,
    max: usize,
    default: usize,
) -> Result<usize, ApiError> {
    match get(params, "MaxResults") {
        None => Ok(default),
        Some(m) => match m.parse::<usize>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::bad(
                "InvalidParameterValue",
                format!(
                    "Value ( {m} ) for parameter maxResults is invalid. Expecting a value between {min} and {max}."
                ),
            )),
        },
    }
}

/// Where `NextToken` resumes (0 without one).
pub(crate) fn offset(params: &[(String, String)]) -> Result<usize, ApiError> {
    match get(params, "NextToken") {
        None => Ok(0),
        Some(t) => decode_token(t)
            .ok_or_else(|| ApiError::bad("InvalidParameterValue", "The nextToken is invalid")),
    }
}

/// `Filter.N.Name` / `Filter.N.Value.M`, each name one of `allowed`.
pub(crate) fn filters(
    params: &[(String, String)],
    allowed: &[&str],
) -> Result<Vec<(String, Vec<String>)>, ApiError> {
    let mut indices: Vec<u32> = params
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("Filter.")?.split('.').next()?.parse().ok())
        .collect();
    indices.sort_unstable();
    indices.dedup();
    let mut filters = Vec::new();
    for n in indices {
        let name = get(params, &format!("Filter.{n}.Name")).ok_or_else(|| {
            ApiError::bad(
                "InvalidParameterValue",
                format!("Filter.{n}.Name is missing"),
            )
        })?;
        if !allowed.contains(&name) {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("The filter '{name}' is invalid"),
            ));
        }
        let values = indexed(params, &format!("Filter.{n}.Value"))
            .into_iter()
            .map(|(_, v)| v.to_string())
            .collect();
        filters.push((name.to_string(), values));
    }
    Ok(filters)
}

pub(crate) fn dry_run(params: &[(String, String)]) -> bool {
    get(params, "DryRun") == Some("true")
}

/// As documented: a dry run says whether the call would be allowed, once the caller's
/// credentials and permission are known.
pub(crate) fn dry_run_refusal() -> ApiError {
    ApiError::new(
        StatusCode::PRECONDITION_FAILED,
        "DryRunOperation",
        "Request would have succeeded, but DryRun flag is set.",
    )
}

/// The role lacks `ec2:ACTION`.
pub(crate) fn unauthorized(action: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "UnauthorizedOperation",
        format!(
            "You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/labeler is not authorized to perform: ec2:{action}"
        ),
    )
}

impl crate::MockEc2 {
    /// What every one of these calls checks once its parameters parse, in EC2's order: the
    /// signature (when verification is on), the permission (`denied`: the role lacks
    /// `ec2:ACTION`), then a dry run, which is refused with `DryRunOperation` when all else holds.
    pub(crate) fn admit(
        &self,
        signed: Option<&crate::auth::SignedRequest<'_>>,
        denied: bool,
        action: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        if let Some(signed) = signed {
            self.registry()
                .authenticate(signed, std::time::SystemTime::now())?;
        }
        if denied {
            return Err(unauthorized(action));
        }
        if dry_run {
            return Err(dry_run_refusal());
        }
        Ok(())
    }
}

/// One page of `items` from `offset`, `page` long, and the token of the next page if any.
pub(crate) fn page<T>(items: &[T], offset: usize, page: usize) -> (&[T], Option<String>) {
    let end = offset.saturating_add(page).min(items.len());
    let next = (end < items.len()).then(|| encode_token(end));
    (items.get(offset..end).unwrap_or_default(), next)
}

/// `<tag>value</tag>` on a line of its own, escaped.
pub(crate) fn element(s: &mut String, indent: &str, tag: &str, value: &str) {
    use std::fmt::Write;
    let _ = writeln!(s, "{indent}<{tag}>{}</{tag}>", xml_escape(value));
}

/// What the modules' tests ask and read.
#[cfg(test)]
pub(crate) mod testing {
    use crate::Outcome;

    pub(crate) fn params(action: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut p = vec![
            ("Action".to_string(), action.to_string()),
            ("Version".to_string(), crate::API_VERSION.to_string()),
        ];
        p.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        p
    }

    pub(crate) fn body(outcome: Outcome) -> String {
        match outcome {
            Outcome::Raw(body, _) => body,
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => {
                panic!("refused: {} {}", e.code, e.message)
            }
        }
    }

    pub(crate) fn refused(outcome: Outcome) -> &'static str {
        match outcome {
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => e.code,
            Outcome::Raw(body, _) => panic!("answered: {body}"),
        }
    }
}

//! What a broker speaks (from ApiVersions) and the choice of one version per API.

use std::collections::HashMap;

use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use kafka_protocol::protocol::VersionRange;

/// The API version ranges one broker advertised.
#[derive(Debug, Clone, Default)]
pub struct ApiVersionTable {
    ranges: HashMap<i16, VersionRange>,
    /// The cluster's finalized feature levels (`share.version`, `metadata.version`, ...).
    features: HashMap<String, i16>,
}

impl ApiVersionTable {
    /// Builds the table from an ApiVersions response.
    pub fn from_response(resp: &ApiVersionsResponse) -> Self {
        let ranges = resp
            .api_keys
            .iter()
            .map(|k| {
                (
                    k.api_key,
                    VersionRange {
                        min: k.min_version,
                        max: k.max_version,
                    },
                )
            })
            .collect();
        let features = resp
            .finalized_features
            .iter()
            .map(|f| (f.name.to_string(), f.max_version_level))
            .collect();
        ApiVersionTable { ranges, features }
    }

    /// The finalized level of cluster feature `name` (e.g. `share.version`), `None` when the
    /// broker reports none.
    pub fn feature(&self, name: &str) -> Option<i16> {
        self.features.get(name).copied()
    }

    /// Builds a table from explicit ranges (tests, fakes).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (ApiKey, VersionRange)>) -> Self {
        ApiVersionTable {
            ranges: ranges.into_iter().map(|(k, r)| (k as i16, r)).collect(),
            features: HashMap::new(),
        }
    }

    /// The broker's range for `api`, if it offers the API at all.
    pub fn range(&self, api: ApiKey) -> Option<VersionRange> {
        self.ranges.get(&(api as i16)).copied()
    }

    /// The highest version both sides speak: the top of the intersection of the ranges.
    /// `Err` carries the broker's range as text ("none" when absent) for the error message.
    pub fn choose(&self, api: ApiKey, ours: VersionRange) -> Result<i16, String> {
        match self.range(api) {
            None => Err("none".to_owned()),
            Some(theirs) => {
                let both = theirs.intersect(&ours);
                if both.is_empty() {
                    Err(theirs.to_string())
                } else {
                    Ok(both.max)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(min: i16, max: i16) -> VersionRange {
        VersionRange { min, max }
    }

    #[test]
    fn picks_the_top_of_the_intersection() {
        let t = ApiVersionTable::from_ranges([
            (ApiKey::ShareFetch, r(1, 2)),
            (ApiKey::Metadata, r(0, 13)),
        ]);
        assert_eq!(t.choose(ApiKey::ShareFetch, r(1, 2)), Ok(2));
        assert_eq!(
            t.choose(ApiKey::ShareFetch, r(1, 1)),
            Ok(1),
            "a v1-only client stays on v1"
        );
        assert_eq!(t.choose(ApiKey::Metadata, r(4, 12)), Ok(12), "our cap wins");
    }

    #[test]
    fn a_v1_broker_gives_v1_to_a_v2_client() {
        let t = ApiVersionTable::from_ranges([(ApiKey::ShareFetch, r(1, 1))]);
        assert_eq!(t.choose(ApiKey::ShareFetch, r(1, 2)), Ok(1));
    }

    #[test]
    fn disjoint_or_missing_ranges_are_errors_naming_the_broker_range() {
        let t = ApiVersionTable::from_ranges([(ApiKey::ShareGroupHeartbeat, r(0, 0))]);
        assert_eq!(
            t.choose(ApiKey::ShareGroupHeartbeat, r(1, 1)),
            Err("0..0".to_owned())
        );
        assert_eq!(
            t.choose(ApiKey::ShareFetch, r(1, 2)),
            Err("none".to_owned())
        );
    }
}

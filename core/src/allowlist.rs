//! Egress allow-lists (DESIGN 10): what a policy says, and where it lets a connection go.
//!
//! A policy is an allow-list; empty is `none`, the default. A rule is a host name (exact), a
//! suffix (`*.example.com`: any name below it, not the name itself) or a CIDR block (a bare
//! address is its own /32 or /128); each allows every port. The sandbox's spec holds one, and
//! each provider may name the endpoints its credentials are for. Berth's egress proxy, outside
//! the sandbox, decides every connection by [`Policy::reachable`].

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Most rules one spec or provider may hold.
pub const MAX_RULES: usize = 64;
/// The longest host name DNS carries.
const MAX_NAME_BYTES: usize = 253;

/// One allow-list entry. Host names are kept lowercase: DNS names compare without case.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Rule {
    Host(String),
    /// The part after `*.`.
    Suffix(String),
    Cidr(IpNet),
}

impl Rule {
    /// A rule as a user writes it: `api.example.com`, `*.example.com`, `10.0.0.0/8` or
    /// `192.0.2.7`.
    pub fn parse(text: &str) -> Result<Rule, String> {
        if let Ok(net) = text.parse::<IpNet>() {
            return Ok(Rule::Cidr(net.trunc()));
        }
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Ok(Rule::Cidr(IpNet::from(addr)));
        }
        if text.contains('/') {
            return Err(format!("'{text}' is not a CIDR block (an address, a slash and a prefix length)"));
        }
        let (suffix, name) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let name = host_name(name).map_err(|why| format!("'{text}' is not a host name: {why}"))?;
        Ok(if suffix { Rule::Suffix(name) } else { Rule::Host(name) })
    }

    /// Whether a connection to `name` (if it was asked for by name) at `addr` is allowed.
    fn allows(&self, name: Option<&str>, addr: IpAddr) -> bool {
        match (self, name) {
            (Rule::Host(host), Some(name)) => host == name,
            (Rule::Suffix(suffix), Some(name)) => {
                name.len() > suffix.len() + 1 && name.ends_with(suffix.as_str()) && {
                    let dot = name.len() - suffix.len() - 1;
                    name.as_bytes()[dot] == b'.'
                }
            }
            (Rule::Cidr(net), _) => net.contains(&addr),
            (Rule::Host(_) | Rule::Suffix(_), None) => false,
        }
    }
}

/// A host name as DNS has it, lowercased: labels of letters, digits and inner hyphens, each at
/// most 63 bytes, at most 253 in all; no trailing dot, and not all digits (that would be an
/// address, and one that failed to parse).
pub fn host_name(name: &str) -> Result<String, &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return Err("it is longer than 253 bytes");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label");
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 bytes");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err("only letters, digits, hyphens and dots are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with a hyphen");
        }
    }
    if name.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("it is neither a name nor an address");
    }
    Ok(name.to_ascii_lowercase())
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Host(host) => f.write_str(host),
            Rule::Suffix(suffix) => write!(f, "*.{suffix}"),
            Rule::Cidr(net) => write!(f, "{net}"),
        }
    }
}

impl From<Rule> for String {
    fn from(rule: Rule) -> String {
        rule.to_string()
    }
}

impl TryFrom<String> for Rule {
    type Error = String;
    fn try_from(text: String) -> Result<Rule, String> {
        Rule::parse(&text)
    }
}

/// An allow-list; empty allows nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Policy {
    pub allow: Vec<Rule>,
}

impl Policy {
    /// Rules as the wire carries them, each named by `field[i]` when it is refused.
    pub fn parse<'a>(field: &str, rules: impl IntoIterator<Item = &'a str>) -> Result<Policy, Error> {
        let allow = rules
            .into_iter()
            .enumerate()
            .map(|(i, text)| Rule::parse(text.trim()).map_err(|why| Error::invalid(format!("{field}[{i}]"), why)))
            .collect::<Result<Vec<_>, _>>()?;
        let policy = Policy { allow };
        policy.validate(field)?;
        Ok(policy)
    }

    pub fn validate(&self, field: &str) -> Result<(), Error> {
        if self.allow.len() > MAX_RULES {
            return Err(Error::invalid(field, format!("at most {MAX_RULES} rules, got {}", self.allow.len())));
        }
        Ok(())
    }

    pub fn is_none(&self) -> bool {
        self.allow.is_empty()
    }

    /// Of the addresses `target` resolved to, those a connection may go to: every one when
    /// the name is allowed, otherwise those a CIDR rule allows. `name` is `None` when the target
    /// was an address. An address of the proxy's own host (loopback, link-local, unspecified:
    /// where a cloud's metadata service and the host's own services answer) is reached through
    /// an allowed name only if the resolution was `pinned` by the operator, or a block names it:
    /// a name whose DNS an attacker controls cannot point into the host. Empty: refused.
    pub fn reachable(&self, name: Option<&str>, addrs: &[IpAddr], pinned: bool) -> Vec<IpAddr> {
        let name = name.map(str::to_ascii_lowercase);
        let by_block = |addr: &IpAddr| self.allow.iter().any(|rule| rule.allows(None, *addr));
        let by_name = |addr: &IpAddr| {
            (pinned || !host_internal(*addr)) && self.allow.iter().any(|rule| rule.allows(name.as_deref(), *addr))
        };
        addrs.iter().copied().filter(|addr| by_block(addr) || by_name(addr)).collect()
    }
}

/// An address that is the proxy's host itself, or its link: never reached through DNS alone.
fn host_internal(addr: IpAddr) -> bool {
    let addr = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match addr {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || v6.is_unicast_link_local(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: &[&str]) -> Policy {
        Policy::parse("spec.egress.allow", rules.iter().copied()).unwrap()
    }

    fn addr(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn rules_parse_to_their_kind_and_print_back() {
        assert_eq!(Rule::parse("API.Example.com").unwrap(), Rule::Host("api.example.com".into()));
        assert_eq!(Rule::parse("*.example.com").unwrap(), Rule::Suffix("example.com".into()));
        assert_eq!(Rule::parse("10.1.2.3/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(Rule::parse("192.0.2.7").unwrap().to_string(), "192.0.2.7/32");
        assert_eq!(Rule::parse("2001:db8::1").unwrap().to_string(), "2001:db8::1/128");
        assert_eq!(Rule::parse("localhost").unwrap(), Rule::Host("localhost".into()));
        for text in ["*.example.com", "one.test", "127.0.0.0/8", "::/0"] {
            let rule = Rule::parse(text).unwrap();
            assert_eq!(Rule::parse(&rule.to_string()).unwrap(), rule);
            let json = serde_json::to_string(&rule).unwrap();
            assert_eq!(serde_json::from_str::<Rule>(&json).unwrap(), rule);
        }
    }

    #[test]
    fn malformed_rules_are_refused_with_the_entry_named() {
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.b",
            "a-.b",
            "a_b.c",
            "exa mple.com",
            "10.0.0.0/33",
            "10.0.0/8",
            "1.2.3",
            "http://x.com",
            "x.com:443",
            "a.b.",
            "*.*.b",
            &"a".repeat(64),
            &format!("{}.c", "a.".repeat(130)),
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?} parsed");
            match Policy::parse("spec.egress.allow", ["ok.test", bad]) {
                Err(Error::Invalid { field, .. }) => assert_eq!(field, "spec.egress.allow[1]", "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(serde_json::from_str::<Rule>("\"a..b\"").is_err());
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("h{i}.test")).collect();
        match Policy::parse("endpoints", many.iter().map(String::as_str)) {
            Err(Error::Invalid { field, .. }) => assert_eq!(field, "endpoints"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_name_is_allowed_by_its_rule_and_an_address_by_its_block() {
        let p = policy(&["one.test", "*.svc.test", "127.0.0.2/32"]);
        let two = [addr("192.0.2.3")];
        assert_eq!(p.reachable(Some("one.test"), &two, false), two, "an allowed name goes wherever it resolves");
        assert_eq!(p.reachable(Some("ONE.test"), &two, false), two);
        assert_eq!(p.reachable(Some("a.svc.test"), &two, false), two);
        assert_eq!(p.reachable(Some("a.b.svc.test"), &two, false), two);
        assert!(p.reachable(Some("svc.test"), &two, false).is_empty(), "a suffix is not its own name");
        assert!(p.reachable(Some("xsvc.test"), &two, false).is_empty());
        assert!(p.reachable(Some("two.test"), &two, false).is_empty());
        assert!(p.reachable(None, &two, false).is_empty());
        assert_eq!(p.reachable(None, &[addr("127.0.0.2")], false), [addr("127.0.0.2")]);
        // A name no rule names reaches only the addresses a block allows.
        let both = [addr("192.0.2.3"), addr("127.0.0.2")];
        assert_eq!(p.reachable(Some("other.test"), &both, false), [addr("127.0.0.2")]);
        assert!(Policy::default().reachable(Some("one.test"), &both, true).is_empty(), "none allows nothing");
    }

    #[test]
    fn dns_alone_never_points_an_allowed_name_into_the_host() {
        let p = policy(&["one.test", "127.0.0.5/32"]);
        for inside in ["127.0.0.1", "169.254.169.254", "0.0.0.0", "::1", "fe80::1", "::ffff:127.0.0.1"] {
            let resolved = [addr(inside), addr("192.0.2.1")];
            assert_eq!(p.reachable(Some("one.test"), &resolved, false), [addr("192.0.2.1")], "{inside}");
            assert_eq!(p.reachable(Some("one.test"), &resolved, true), resolved, "{inside}: pinned by the operator");
        }
        assert_eq!(p.reachable(Some("one.test"), &[addr("127.0.0.5")], false), [addr("127.0.0.5")], "a block names it");
        assert_eq!(
            p.reachable(Some("one.test"), &[addr("10.1.2.3")], false),
            [addr("10.1.2.3")],
            "private is not the host"
        );
    }
}

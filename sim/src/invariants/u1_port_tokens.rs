//! U1 (DESIGN 16): a port's access token works only for the generation it was issued for. A
//! client holds a URL's token, naming the sandbox and generation it was issued for, and asks
//! through the gateway's preview proxy, maybe after a stop and a start: whatever run answers
//! must be that one (a simulated run answers with its sandbox id and generation). A refusal
//! (410 Gone for a token whose run is over, 409 for a run not Ready, 502) breaks nothing.

/// The problem, if a request with a token of `sandbox`'s (named `name`) run `issued` was
/// answered (`status`) by another run (`body`: `<sandbox id> <generation>` of the run that
/// served it).
pub fn served_by_another_run(name: &str, sandbox: &str, issued: u64, status: u16, body: &str) -> Option<String> {
    let expected = format!("{sandbox} {issued}");
    (status == 200 && body != expected)
        .then(|| format!("a token of run {issued} of '{name}' ({sandbox}) reached another run: '{body}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_answered_by_a_later_run_or_another_sandbox_fires() {
        let later = served_by_another_run("sb-0", "sb-a", 2, 200, "sb-a 3").unwrap();
        assert!(later.contains("run 2 of 'sb-0'") && later.contains("'sb-a 3'"), "{later}");
        assert!(served_by_another_run("sb-0", "sb-a", 1, 200, "sb-b 1").is_some(), "made again under its name");
    }

    #[test]
    fn its_own_run_or_a_refusal_does_not() {
        assert_eq!(served_by_another_run("sb-0", "sb-a", 2, 200, "sb-a 2"), None);
        for refused in [410, 409, 502, 404] {
            assert_eq!(served_by_another_run("sb-0", "sb-a", 2, refused, "port 8080 of sandbox 'sb-0': ..."), None);
        }
    }
}

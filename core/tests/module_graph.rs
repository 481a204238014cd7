//! berth-core's modules form a DAG: data types in leaf modules, rules over them above, so the
//! crate reads bottom-up. A module that names another (`crate::x::...` in code, a `use` or a
//! path) depends on it; `crate::Item` depends on the crate root. A cycle fails this test, with
//! the modules that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = "lib";

#[test]
fn core_modules_form_a_dag() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.len() > 1, "no modules found under {}", src.display());
    if let Some(cycle) = find_cycle(&graph) {
        panic!("berth-core's modules import each other in a cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let graph: Graph = [("a", &["b"][..]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"])]
        .into_iter()
        .map(|(m, deps)| (m.to_string(), deps.iter().map(|d| d.to_string()).collect()))
        .collect();
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let names = modules_named("use crate::{a, b::{C, d}};\n// crate::e\nlet x = crate::c::f(crate::G);");
    assert_eq!(names, ["G", "a", "b", "c"].map(String::from).into());
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Each top-level module of `src` (a file `x.rs`, or a directory `x/` with everything in it)
/// and the modules it names; the root is `lib`.
fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        let module = if module == "main" { ROOT.to_string() } else { module };
        let text = std::fs::read_to_string(&file).unwrap();
        let named = graph.entry(module.clone()).or_default();
        named.extend(modules_named(&text).into_iter().filter(|m| *m != module));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for named in graph.values_mut() {
        // `crate::x` for an `x` that is not a module is an item of the root.
        *named = named.iter().map(|m| if modules.contains(m) { m.clone() } else { ROOT.to_string() }).collect();
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The first segment of every `crate::` path in `text`'s code (comments, where doc links live,
/// are not dependencies), each name of a `crate::{...}` group included.
fn modules_named(text: &str) -> BTreeSet<String> {
    let code: String = text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut named = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth < 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut depth = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        named.extend(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else {
            named.extend(first_segment(rest));
        }
    }
    named
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty() && name != "self").then_some(name)
}

/// A cycle of `graph`, as the modules along it with the first repeated at the end.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(module: &str, graph: &Graph, marks: &mut BTreeMap<String, Mark>, path: &mut Vec<String>) -> bool {
        match marks.get(module) {
            Some(Mark::Done) => return false,
            Some(Mark::Open) => {
                let start = path.iter().position(|m| m == module).unwrap();
                path.drain(..start);
                path.push(module.to_string());
                return true;
            }
            None => {}
        }
        marks.insert(module.to_string(), Mark::Open);
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if visit(next, graph, marks, path) {
                return true;
            }
        }
        path.pop();
        marks.insert(module.to_string(), Mark::Done);
        false
    }
    let mut marks = BTreeMap::new();
    for module in graph.keys() {
        let mut path = Vec::new();
        if visit(module, graph, &mut marks, &mut path) {
            return Some(path);
        }
    }
    None
}

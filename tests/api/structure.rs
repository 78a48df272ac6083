//! The layering rules of docs/ARCHITECTURE.md, checked on the source itself, and the
//! ledger's status set held to the database's CHECK constraint.
//!
//! Module graph: every `crate::…` and `super::…` path in non-test code of `src/` (the
//! binaries excluded) and of the `x402` crate (`crates/x402/src/`, read as the module `x402`,
//! its `crate::` as `x402::`) is an edge from the file's module to the module it names. Among the
//! children of any module, those edges must form no cycle (so `relay` ↔ `payments`,
//! `x402::sign` ↔ `x402::wire` or `error` ↔ `relay` cannot come back), and a few modules
//! may only depend on the plumbing below them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use diesel_async::RunQueryDsl;

use crate::helpers::spawn_app;

type Module = Vec<String>;

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                source_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/relay/pay.rs` → `["relay", "pay"]`; `src/lib.rs` → `[]`.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its `#[cfg(test)] mod tests { … }` block.
fn code_of(text: &str) -> String {
    let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
    let code = code.join("\n");
    let Some(start) = code.find("#[cfg(test)]\nmod tests {") else {
        return code;
    };
    let open = start + code[start..].find('{').unwrap_or(0);
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return format!("{}{}", &code[..start], &code[open + i + 1..]);
                }
            }
            _ => {}
        }
    }
    code[..start].to_owned()
}

/// Every module path a file names, resolved to the longest known module.
fn references(
    module: &Module,
    crate_root: &Module,
    is_mod_file: bool,
    code: &str,
    known: &BTreeSet<Module>,
) -> BTreeSet<Module> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < code.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let (mut base, skip) = if rest.starts_with("crate::") && (i == 0 || !is_ident(bytes[i - 1])) {
            (crate_root.clone(), "crate::".len())
        } else if rest.starts_with("super::") && (i == 0 || !is_ident(bytes[i - 1])) {
            // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` it is also `a`.
            let mut m = module.clone();
            let _ = is_mod_file;
            m.pop();
            (m, "super::".len())
        } else {
            i += 1;
            continue;
        };
        // Read `seg::seg::…`, or a `{a::b, c}` group, after the prefix.
        let tail = &code[i + skip..];
        let group: Vec<&str> = if let Some(inner) = tail.strip_prefix('{') {
            inner.split('}').next().unwrap_or("").split(',').collect()
        } else {
            vec![tail]
        };
        for path in group {
            let mut m = base.clone();
            for seg in path.trim().split("::") {
                let seg: String = seg.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if seg.is_empty() || seg == "super" {
                    break;
                }
                m.push(seg);
                if !known.contains(&m) {
                    m.pop();
                    break;
                }
            }
            out.insert(m);
        }
        base.clear();
        i += skip;
    }
    out
}

/// The source roots of the module graph: the router's `src/` (the root module) and the `x402`
/// crate's, read as the router's module `x402` (which re-exports it).
fn source_roots() -> [(PathBuf, Module); 2] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [(root.join("src"), Module::new()), (root.join("crates/x402/src"), vec!["x402".to_owned()])]
}

/// Every library source file: (path, its module, its crate's root module).
fn library_files() -> Vec<(PathBuf, Module, Module)> {
    let mut out = Vec::new();
    for (src, prefix) in source_roots() {
        let mut files = Vec::new();
        source_files(&src, &mut files);
        for f in files {
            let mut module = prefix.clone();
            module.extend(module_of(&src, &f));
            out.push((f, module, prefix.clone()));
        }
    }
    out
}

/// A library file's path for messages: relative to `src/`, or `x402/…` for the x402 crate's.
fn display_path(file: &Path) -> String {
    let [(src, _), (x402, _)] = source_roots();
    match file.strip_prefix(&x402) {
        Ok(rel) => format!("x402/{}", rel.display()),
        Err(_) => file.strip_prefix(&src).unwrap_or(file).display().to_string(),
    }
}

fn module_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let files = library_files();
    let known: BTreeSet<Module> = files.iter().map(|(_, m, _)| m.clone()).collect();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (f, module, root) in &files {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let is_mod = f.file_name().is_some_and(|n| n == "mod.rs");
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        graph.entry(module.clone()).or_default().extend(references(module, root, is_mod, &code, &known));
    }
    graph
}

/// Edges among the children of `parent`: `a → b` when code under `parent::a` names `parent::b…`.
fn child_edges(graph: &BTreeMap<Module, BTreeSet<Module>>, parent: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in graph {
        if from.len() <= parent.len() || from[..parent.len()] != *parent {
            continue;
        }
        let a = &from[parent.len()];
        for to in targets {
            if to.len() > parent.len() && to[..parent.len()] == *parent && to[parent.len()] != *a {
                edges.entry(a.clone()).or_default().insert(to[parent.len()].clone());
            }
        }
    }
    edges
}

fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(pos) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[pos..].to_vec();
            cycle.push(n.to_owned());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_depends_on_a_sibling_that_depends_back_on_it() {
    let graph = module_graph();
    let parents: BTreeSet<Module> = graph.keys().flat_map(|m| (0..m.len()).map(|i| m[..i].to_vec())).collect();
    for parent in parents {
        let edges = child_edges(&graph, &parent);
        if let Some(cycle) = find_cycle(&edges) {
            panic!("import cycle among the children of `crate::{}`: {}", parent.join("::"), cycle.join(" → "));
        }
    }
}

#[test]
fn the_layers_depend_only_downwards() {
    let graph = module_graph();
    let top = child_edges(&graph, &[]);
    let deps = |m: &str| top.get(m).cloned().unwrap_or_default();
    let allowed = |m: &str, ok: &[&str]| {
        let extra: Vec<String> = deps(m).into_iter().filter(|d| !ok.contains(&d.as_str())).collect();
        assert!(extra.is_empty(), "`{m}` may depend only on {ok:?}, but names {extra:?}");
    };
    // The ledger knows nothing above the database (and the leaf of OpenAPI member schemas).
    allowed("payments", &["db", "money", "clock", "schema_doc"]);
    allowed("schema_doc", &[]);
    allowed("money", &[]);
    allowed("clock", &[]);
    allowed("db", &[]);
    // HTTP is known to the entry points (the route table, the MCP server, the command line,
    // which prints the OpenAPI document), the one error mapping and the auth extractors only.
    for m in top.keys() {
        if !["routes", "mcp", "error", "auth", "startup", "commands"].contains(&m.as_str()) {
            assert!(!deps(m).contains("error"), "`{m}` must not use the HTTP error type; return a domain error");
            assert!(!deps(m).contains("routes"), "`{m}` must not depend on the route table");
        }
    }
    // The use case does not reach back into the layers that call it.
    for m in ["relay", "payments", "idempotency", "x402", "receipts", "upstream"] {
        for above in ["routes", "mcp", "commands", "startup"] {
            assert!(!deps(m).contains(above), "`{m}` must not depend on `{above}`");
        }
    }
}

/// A payment scheme is a folder behind `relay::pay::scheme::Scheme` (issue 39): the walk and
/// everything outside `relay::pay` name no scheme folder, only the registry does, and the
/// scheme folders name nothing of each other. Nor does anything but the registry ask which
/// scheme a network belongs to.
#[test]
fn a_scheme_is_a_folder_only_the_registry_names() {
    let graph = module_graph();
    let pay: Module = vec!["relay".into(), "pay".into()];
    let folder = |m: &Module| -> Option<String> {
        (m.len() > 2 && m[..2] == pay[..] && ["evm", "svm", "batch"].contains(&m[2].as_str())).then(|| m[2].clone())
    };
    let registry: Module = vec!["relay".into(), "pay".into(), "registry".into()];
    let mut found = Vec::new();
    for (from, targets) in &graph {
        for target in targets {
            let Some(scheme) = folder(target) else { continue };
            match folder(from) {
                Some(own) if own == scheme => {}
                Some(own) => found.push(format!("the scheme folder `{own}` names `{}`", target.join("::"))),
                None if *from == registry => {}
                None => found.push(format!("`{}` names the scheme folder `{}`", from.join("::"), target.join("::"))),
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
    for (file, module, _) in library_files() {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        if code.contains("is_solana_network(")
            && module != registry
            && module != ["chains".to_owned(), "solana".to_owned()]
        {
            found.push(display_path(&file));
        }
    }
    assert!(found.is_empty(), "which scheme a network belongs to is asked outside the registry: {found:?}");
}

/// Recovery of a lost answer (issue 16) re-sends what the ledger holds and can never make a
/// new payment: neither it nor anything it reaches (transitively) names the signing code,
/// the application state or the configuration (the holders of the wallet key), and its own
/// code names no signer (neither the payment signer nor the sign-in signer of `x402::siwx`).
/// Fails as soon as a path from `recovery` to a signature appears.
#[test]
fn recovery_cannot_reach_anything_that_signs() {
    let graph = module_graph();
    let m = |p: &str| -> Module { p.split("::").map(str::to_owned).collect() };
    // `x402::siwx` signs sign-in messages (re-access, issue 16): relay calls it, recovery must
    // not reach it either.
    // `x402::svm::transfer` signs Solana payments (recovery reads the Solana chain through
    // `x402::svm::rpc` and the signed record of `x402::svm::record` only).
    let forbidden = [
        m("x402::sign"),
        m("x402::siwx"),
        m("x402::payload"),
        m("x402::nonce"),
        m("x402::svm::transfer"),
        m("x402::svm"),
        m("state"),
        m("relay"),
        m("startup"),
    ];
    // The x402 root re-exports `sign_authorization`, and `Config` holds the wallet key:
    // recovery names neither (the upstream client below it reads only `UpstreamConfig`).
    let direct = graph.get(&m("recovery")).cloned().unwrap_or_default();
    for root in [m("x402"), m("config")] {
        assert!(!direct.contains(&root), "recovery names `{}`: {direct:?}", root.join("::"));
    }
    let mut seen: BTreeSet<Module> = BTreeSet::new();
    let mut todo = vec![m("recovery")];
    while let Some(next) = todo.pop() {
        for dep in graph.get(&next).into_iter().flatten() {
            // A module's parent file only declares it; follow the named module itself.
            if seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    for f in &forbidden {
        assert!(!seen.contains(f), "recovery reaches `{}` (through {seen:?}): it could sign", f.join("::"));
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/recovery.rs");
    let code = code_of(&std::fs::read_to_string(src).unwrap());
    for name in [
        "sign_authorization",
        "sign_in",
        "siwx",
        "signer",
        "Signer",
        "sign_hash",
        "sign_message",
        "AppState",
        "Config",
        "nonce_secret",
        "alloy::signers",
    ] {
        assert!(!code.contains(name), "src/recovery.rs names `{name}`: recovery must not be able to sign");
    }
}

/// One writer of the ledger (issue 22): no code outside `src/payments/` writes the `payments`
/// table, in SQL or through diesel's DSL. `reconcile`, `gc`, audit and the relay call the
/// `payments` module, whose writes are fenced or guarded by what their caller decided on.
#[test]
fn only_the_payments_module_writes_the_payments_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let writes = [
        "update payments",
        "insert into payments",
        "delete from payments",
        "update(payments",
        "insert_into(payments",
        "delete(payments",
        "truncate payments",
    ];
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(src.join("payments"))) {
        // Whitespace folded and lower-cased, so `UPDATE  payments` or a line break between
        // the words cannot slip through.
        let code = code_of(&std::fs::read_to_string(file).unwrap()).to_lowercase();
        let folded = code.split_whitespace().collect::<Vec<_>>().join(" ").replace("\\ ", "");
        for w in writes {
            if folded.contains(w) || folded.replace("payments::table", "payments").contains(w) {
                found.push(format!("{}: {w}", file.strip_prefix(&src).unwrap().display()));
            }
        }
    }
    assert!(found.is_empty(), "writes to `payments` outside src/payments/: {found:?}");
}

/// One way to reach an upstream (issue 22): only `src/upstream/` builds an HTTP client for
/// upstreams (its SSRF guard, timeouts and size limits), and `UpstreamClient` is built from
/// the one `UpstreamConfig` in exactly the two processes that reach upstreams: `serve`
/// (`startup.rs`; MCP over HTTP, SIWX and recovery within a call use its client) and
/// `reconcile`'s recovery (`commands/reconcile.rs`). The other HTTP clients are not for upstreams: the
/// stdio MCP server's client of the router (`mcp/backend.rs`) and the chain's RPC transport
/// (`crates/x402/src/rpc.rs`, alloy).
/// A recovery's log is `payments::RecoveryStep`, never JSON built by hand.
#[test]
fn recovery_logs_are_typed_steps() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let found: Vec<String> = files
        .iter()
        .filter(|f| {
            let code = code_of(&std::fs::read_to_string(f).unwrap());
            code.split_whitespace().collect::<String>().contains("json!({\"action\"")
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(found.is_empty(), "hand-built recovery entries in: {found:?}");
}

/// Errors are types of their layer (`thiserror`), never bare strings: a caller can match on
/// them, and the HTTP mapping in `error/mod.rs` sees what it maps.
#[test]
fn no_function_in_src_returns_a_bare_string_error() {
    let mut found = Vec::new();
    for (file, _, _) in &library_files() {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let folded: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        // `Result<T, String>` with any T (nested generics included), and `type Err = String`.
        let bare = folded.contains(", String>")
            && folded.split("Result<").skip(1).any(|rest| {
                let mut depth = 1;
                for (i, ch) in rest.char_indices() {
                    match ch {
                        '<' => depth += 1,
                        '>' => {
                            depth -= 1;
                            if depth == 0 {
                                return rest[..i].trim_end().ends_with(", String");
                            }
                        }
                        _ => {}
                    }
                }
                false
            });
        if bare || folded.contains("type Err = String") {
            found.push(display_path(file));
        }
    }
    assert!(found.is_empty(), "bare String errors in: {found:?}");
}

/// What a response shows is typed (issue 28): `relay::view::PaymentView` for a payment, a
/// `Serialize` struct for the other answers. No code outside the view module patches a JSON
/// object after it was built (`v["x"] = …`, `as_object_mut()`, `if let Value::Object(m) =
/// &mut v`). The wire code (`src/x402`) and the binaries are not checked yet; the files
/// listed below edit documents that are not responses built here, each for a stated reason.
#[test]
fn no_json_object_is_patched_outside_the_view() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let exempt = [
        // Not checked yet (its own owner, issue 28 item 7).
        "x402/",
        // The view itself.
        "relay/view.rs",
        // The OpenAPI document: generated from the route table by filling in a template.
        "routes/openapi/",
        // A receipt's signed message is the receipt without its `signature` member.
        "receipts/mod.rs",
        "audit/verify.rs",
    ];
    let mut found = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        if exempt.iter().any(|e| rel.starts_with(e)) {
            continue;
        }
        let folded: String = code_of(&std::fs::read_to_string(file).unwrap()).split_whitespace().collect();
        let index_assign = folded.match_indices("\"]=").any(|(i, m)| !folded[i + m.len()..].starts_with('='));
        let object_mut = folded.match_indices("Value::Object(").any(|(i, m)| {
            let rest = &folded[i + m.len()..];
            rest.find(')').is_some_and(|close| rest[close..].starts_with(")=&mut"))
        });
        if index_assign || object_mut || folded.contains("as_object_mut(") {
            found.push(rel);
        }
    }
    assert!(found.is_empty(), "JSON objects patched outside the view: {found:?}");
}

/// A stored intent is decoded once (issue 28): only `relay/view.rs` parses a ledger row's
/// `signed_authorization` or turns its stored version number back into an `X402Version`.
#[test]
fn stored_intents_are_decoded_only_by_the_view() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        if rel.starts_with("x402/") || rel == "relay/view.rs" {
            continue;
        }
        let folded: String = code_of(&std::fs::read_to_string(file).unwrap()).split_whitespace().collect();
        let parses = folded.match_indices("from_value(").any(|(i, m)| {
            folded[i + m.len()..].split(')').next().is_some_and(|arg| arg.contains("signed_authorization"))
        });
        if parses || folded.contains("from_number(") {
            found.push(rel);
        }
    }
    assert!(found.is_empty(), "stored intents decoded outside relay/view.rs: {found:?}");
}

/// The code of a file before its `#[cfg(test)] mod tests` block (comments kept: a function's
/// length is what a reader reads).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests {").map_or(text, |i| &text[..i])
}

/// `(name, first line, lines)` of every function of `code` that has a body.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let mut rest = t;
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let Some(sig) = rest.strip_prefix("fn ") else { continue };
        let name: String = sig.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // Walk to the body's closing brace, skipping string and char literals.
        let (mut depth, mut started, mut end) = (0i32, false, None);
        'lines: for (j, l) in lines.iter().enumerate().skip(i) {
            let chars: Vec<char> = l.chars().collect();
            let mut k = 0;
            while k < chars.len() {
                match chars[k] {
                    '/' if chars.get(k + 1) == Some(&'/') => break,
                    '"' => {
                        k += 1;
                        while k < chars.len() && chars[k] != '"' {
                            k += if chars[k] == '\\' { 2 } else { 1 };
                        }
                    }
                    '\'' if chars.get(k + 2) == Some(&'\'') => k += 2,
                    '{' => (depth, started) = (depth + 1, true),
                    '}' => depth -= 1,
                    ';' if !started => break 'lines,
                    _ => {}
                }
                if started && depth == 0 {
                    end = Some(j);
                    break 'lines;
                }
                k += 1;
            }
        }
        if let Some(end) = end {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
}

/// Small pieces (issue 28): no function over 80 lines, no file over 600, in the router's
/// `src/` and in every workspace crate's `src/` (test modules and `tests.rs` files excepted).
#[test]
fn no_function_over_80_lines_and_no_file_over_600() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("src")];
    for krate in std::fs::read_dir(root.join("crates")).unwrap() {
        dirs.push(krate.unwrap().path().join("src"));
    }
    let mut found = Vec::new();
    for dir in &dirs {
        let mut files = Vec::new();
        source_files(dir, &mut files);
        for file in &files {
            let rel = file.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            if rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            let code = without_tests(&text);
            if code.lines().count() > 600 {
                found.push(format!("{rel}: {} lines", code.lines().count()));
            }
            for (name, line, len) in functions(code) {
                if len > 80 {
                    found.push(format!("{rel}:{line} fn {name}: {len} lines"));
                }
            }
        }
    }
    assert!(found.is_empty(), "too long: {found:#?}");
}

#[test]
fn only_the_upstream_module_builds_a_client_that_reaches_upstreams() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let allowed_builders = ["upstream/mod.rs", "mcp/backend.rs"];
    let allowed_constructors = ["startup.rs", "commands/reconcile.rs", "upstream/mod.rs"];
    let mut found = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let folded: String = code.split_whitespace().collect();
        // `Client::builder(` or `Client::new(` not preceded by an identifier character (so
        // `reqwest::Client::new(` and an imported `Client::new(` count, `ClusterClient…` not).
        let builds = ["Client::builder(", "Client::new(", "ClientBuilder::new("].iter().any(|p| {
            folded.match_indices(p).any(|(i, _)| {
                !folded[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                    && (folded.contains("reqwest") || folded.contains("hyper"))
            })
        });
        if builds && !allowed_builders.contains(&rel.as_str()) {
            found.push(format!("{rel}: builds an HTTP client"));
        }
        let constructs = ["UpstreamClient::new(", "UpstreamClient::with_guard("].iter().any(|p| folded.contains(p));
        if constructs && !allowed_constructors.contains(&rel.as_str()) {
            found.push(format!("{rel}: builds an UpstreamClient"));
        }
    }
    assert!(found.is_empty(), "{found:?}");
}

/// The enum and the database agree on the set of ledger statuses.
#[actix_web::test]
async fn payment_status_enum_matches_the_check_constraint() {
    #[derive(diesel::QueryableByName)]
    struct Def {
        #[diesel(sql_type = diesel::sql_types::Text)]
        def: String,
    }
    let app = spawn_app().await;
    let mut conn = app.db.conn().await;
    let row: Def = diesel::sql_query(
        "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conname = 'payments_status_check'",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    let in_db: BTreeSet<String> = row.def.split('\'').skip(1).step_by(2).map(str::to_owned).collect();
    let in_code: BTreeSet<String> =
        x402_router::payments::PaymentStatus::ALL.iter().map(|s| s.as_str().to_owned()).collect();
    assert_eq!(in_db, in_code, "constraint: {}", row.def);
}

/// Distributed-Postgres readiness: every primary, unique and foreign key of the per-agent
/// tables leads with `agent_id` (the distribution column), and every foreign key points at
/// `agents.id` or at a key that leads with `agent_id` too.
#[actix_web::test]
async fn every_key_of_the_per_agent_tables_leads_with_agent_id() {
    #[derive(diesel::QueryableByName, Debug)]
    struct Key {
        #[diesel(sql_type = diesel::sql_types::Text)]
        tbl: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        def: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        first: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        target: Option<String>,
    }
    let db = crate::helpers::TestDb::new().await;
    let mut conn = db.conn().await;
    let keys: Vec<Key> = diesel::sql_query(
        "SELECT c.conrelid::regclass::text AS tbl, pg_get_constraintdef(c.oid) AS def, a.attname::text AS first, \
                CASE WHEN c.contype = 'f' THEN c.confrelid::regclass::text || '.' || fa.attname END AS target \
           FROM pg_constraint c \
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] \
           LEFT JOIN pg_attribute fa ON fa.attrelid = c.confrelid AND fa.attnum = c.confkey[1] \
          WHERE c.contype IN ('p', 'u', 'f') \
            AND c.conrelid::regclass::text IN ('idempotency_keys', 'receipts', 'payments') \
          ORDER BY 1, 2",
    )
    .load(&mut conn)
    .await
    .unwrap();

    let tables: BTreeSet<&str> = keys.iter().map(|k| k.tbl.as_str()).collect();
    assert_eq!(tables, BTreeSet::from(["idempotency_keys", "payments", "receipts"]));
    for k in &keys {
        assert_eq!(k.first, "agent_id", "{} {}", k.tbl, k.def);
        if let Some(target) = &k.target {
            assert!(target == "agents.id" || target.ends_with(".agent_id"), "{} {}", k.tbl, k.def);
        }
    }
    assert!(keys.len() >= 9, "{keys:#?}");
}

/// Distributed-Postgres readiness, the queries: every statement that the request path
/// (paid call, replay, free call, receipt read, the agent's own spend) sends to a per-agent
/// table names `agent_id` in its filter or, for an insert, in its values, so that a sharded
/// Postgres can route it to one shard. Read from `pg_stat_statements` of a private server.
/// The only exceptions are the operator gauges that every router refreshes once a minute
/// (ledger-wide by design, see `audit::gauges`).
#[actix_web::test]
async fn every_request_path_statement_on_a_per_agent_table_filters_by_agent_id() {
    use crate::helpers::pg_replication::PgServer;
    use crate::helpers::*;
    use serde_json::json;

    let pg = PgServer::start("-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all").await;
    pg.exec("postgres", "CREATE DATABASE x4r").await;
    let url = pg.conninfo("x4r");
    x402_router::db::run_migrations(&url).await.unwrap();
    pg.exec("x4r", "CREATE EXTENSION pg_stat_statements").await;
    let chain = Devnet::start().await;
    let out = router_command().args(["agents", "create", "--name", "a"]).env("DATABASE_URL", &url).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let agent = Agent {
        id: line["agent_id"].as_str().unwrap().parse().unwrap(),
        key: line["api_key"].as_str().unwrap().into(),
    };
    let opts = AppOptions { database_url: Some(url.clone()), extra: chain.router_extra(), ..Default::default() };
    let mut config = config_from(&serve_args(&opts, &url, "test:stmts:", "127.0.0.1:0"));
    x402_router::startup::preflight(&mut config).await.unwrap();
    let app = x402_router::startup::Application::build(config, x402_router::startup::Hooks::default()).unwrap();
    let address = format!("http://127.0.0.1:{}", app.port());
    let server = app.into_server();
    let handle = server.handle();
    tokio::spawn(server);
    let client = reqwest::Client::new();
    pg.exec("x4r", "SELECT pg_stat_statements_reset()").await;

    let paid = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});
    let key = new_key();
    let first: serde_json::Value = route_at(&client, &address, &agent, &key, &paid).await.json().await.unwrap();
    assert_eq!(first["payment"]["status"], "settled", "{first}");
    let replay = route_at(&client, &address, &agent, &key, &paid).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    let free = route_at(&client, &address, &agent, &new_key(), &json!({"url": chain.url("/free")})).await;
    assert_eq!(free.status(), 200);
    let receipt = client
        .get(format!("{address}/receipts/{}", first["receipt_id"].as_str().unwrap()))
        .bearer_auth(&agent.key)
        .send()
        .await
        .unwrap();
    assert_eq!(receipt.status(), 200);
    let me = client.get(format!("{address}/agents/me")).bearer_auth(&agent.key).send().await.unwrap();
    assert_eq!(me.status(), 200);

    #[derive(diesel::QueryableByName)]
    struct Stmt {
        #[diesel(sql_type = diesel::sql_types::Text)]
        query: String,
    }
    let mut conn = x402_router::db::Connector::from_url(&url).unwrap().connect().await.unwrap();
    let statements: Vec<Stmt> = diesel::sql_query(
        "SELECT query FROM pg_stat_statements \
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'x4r') \
            AND query ~ '(idempotency_keys|receipts|payments)' AND query NOT LIKE '%pg_stat_statements%'",
    )
    .load(&mut conn)
    .await
    .unwrap();
    handle.stop(false).await;

    // The gauges' ledger-wide counts (no other statement of the router counts `AS n`).
    let gauges = ["SELECT count(*) AS n FROM"];
    let checked: Vec<String> = statements
        .iter()
        .map(|s| s.query.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|q| !gauges.iter().any(|g| q.contains(g)))
        .collect();
    assert!(checked.len() >= 8, "too few statements seen: {checked:#?}");
    for q in &checked {
        // Foreign-key checks (Postgres's own statements) spell `=` as an operator.
        let filters = q.contains("agent_id = ")
            || q.contains("agent_id\" = ")
            || q.contains("\"agent_id\" OPERATOR(pg_catalog.=)");
        let inserts = q.starts_with("INSERT") && q.contains("agent_id");
        assert!(filters || inserts, "does not filter by agent_id: {q}");
    }
}

/// Every `.rs` file under `dir`, recursively.
fn all_rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all_rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The test code: tests/, examples/ and the test support crate.
fn test_code() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["tests", "examples", "crates/testkit/src"] {
        all_rust_files(&root.join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|f| (f.strip_prefix(root).unwrap().to_owned(), std::fs::read_to_string(&f).unwrap()))
        .collect()
}

#[test]
fn test_code_shares_the_testkit_instead_of_including_files() {
    let attribute = ["#[", "path"].concat();
    let offenders: Vec<String> = test_code()
        .iter()
        .flat_map(|(file, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.trim_start().starts_with(&attribute))
                .map(move |(i, _)| format!("{}:{}", file.display(), i + 1))
        })
        .collect();
    assert!(offenders.is_empty(), "share code through crates/testkit, not {attribute} includes: {offenders:?}");
}

/// No sleep waits for an event: test code polls through the testkit's `wait` helpers. A pause
/// that deliberately lets wall time pass (a lease to run out, a load's pace) says so on its
/// line or in the comment right above it with a `// lets time pass:` comment naming that time.
#[test]
fn test_code_never_sleeps_to_wait_for_an_event() {
    let pauses = [["sleep", "("].concat(), ["let_time_pass", "("].concat()];
    let marker = ["// lets time", " pass:"].concat();
    let mut offenders = Vec::new();
    for (file, text) in test_code() {
        if file.ends_with("crates/testkit/src/wait.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if !pauses.iter().any(|p| code.contains(p.as_str())) || code.contains("fn let_time_pass") {
                continue;
            }
            // The comment block right above the line (or the line itself) says why.
            let above = lines[..i].iter().rev().take_while(|l| l.trim_start().starts_with("//"));
            if !line.contains(&marker) && !above.into_iter().any(|l| l.contains(&marker)) {
                offenders.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "wait for an event with x402_router_testkit::wait (wait_until, wait_for, Deadline), or say \
         which time a pause lets pass with `{marker} …`:\n{}",
        offenders.join("\n")
    );
}

/// The kind of a file shows in its folder (issue 53): `src/` keeps at most twelve loose
/// files besides `main.rs` and `lib.rs`; the rest live in folders by kind (`commands/`,
/// `chains/`, `error/`, …).
#[test]
fn src_keeps_at_most_twelve_loose_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loose: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "main.rs" && n != "lib.rs")
        .collect();
    assert!(loose.len() <= 12, "{} loose files in src/ (at most 12): {loose:?}", loose.len());
}

/// `lib.rs`'s map names every top-level module, as `` `name` `` followed by `/` for a folder.
#[test]
fn the_lib_map_lists_every_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let map: String = lib.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .filter(|m| {
            let folder = src.join(m).is_dir();
            let shown = if folder { format!("`{m}/`") } else { format!("`{m}`") };
            !map.contains(&shown)
        })
        .collect();
    assert!(missing.is_empty(), "modules missing from lib.rs's map: {missing:?}");
}

/// Each sub-command is one file of `commands/` holding its flags and its `run` (the model:
/// one `Command` enum, one `match`).
#[test]
fn each_sub_command_is_a_file_with_its_run() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/commands");
    let dispatch = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "mod" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&path).unwrap());
        assert!(code.contains("fn run("), "commands/{name}.rs has no `run`");
        assert!(dispatch.contains(&format!("{name}::run(")), "commands/mod.rs does not dispatch to {name}::run");
    }
}

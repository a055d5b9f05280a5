//! `preflight report --format html`: the merged cluster report as one
//! self-contained page (no script, font, style or image from anywhere
//! else: it opens offline from a file URL and attaches to a ticket). The
//! verdict and its culprits first; the node × check matrix with each
//! cell's message on hover or keyboard focus; the reachability grid; per
//! backend the sweep chart (`chart`); the pair rates as a heatmap; every
//! problem with its hint. Every colour has a mark beside it, and the page
//! prints with the messages written out.

use std::fmt::Write;

use super::chart::sweep_chart;
use super::markdown::{mark, verdict_words};
use super::markup::escape;
use preflight_ground::values::{count, rank_ranges};
use preflight_result::Status;
use preflight_result::merged::{MergedNode, MergedReport};

/// Beyond this many nodes the reachability grid keeps only the nodes in
/// a failed probe, and the heatmap only the slowest pairs as a list.
const GRID: usize = 64;

const STYLE: &str = r#"
:root{--pass:#1a7f37;--warn:#9a6700;--fail:#cf222e;--error:#8250df;--skip:#6e7781;--bg:#fff;--fg:#1f2328;--line:#d0d7de}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);background:var(--bg);margin:0}
main{max-width:1200px;margin:0 auto;padding:16px 24px}
h1{font-size:22px;margin:8px 0} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line)} h3{font-size:15px;margin:16px 0 6px}
code{font:12px ui-monospace,monospace;background:#f6f8fa;padding:1px 4px;border-radius:4px}
.verdict{display:inline-block;padding:4px 12px;border-radius:6px;color:#fff;font-weight:700}
.v-ready{background:var(--pass)} .v-not_ready{background:var(--fail)} .v-incomplete{background:var(--error)}
table{border-collapse:collapse;margin:6px 0} th,td{border:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
.scroll{overflow-x:auto;max-width:100%}
.m{display:inline-block;min-width:1.2em;text-align:center;font-weight:700}
td.s-pass,.s-pass .m{color:var(--pass)} td.s-warn,.s-warn .m{color:var(--warn)} td.s-fail,.s-fail .m{color:var(--fail)}
td.s-error,.s-error .m{color:var(--error)} td.s-skip,.s-skip .m{color:var(--skip)}
td.cell{position:relative;text-align:center;cursor:default}
td.s-fail{background:#ffebe9} td.s-warn{background:#fff8c5} td.s-error{background:#fbefff} td.s-pass{background:#dafbe1}
td.cell:focus{outline:3px solid #0969da;outline-offset:-3px}
.tip{display:none;position:absolute;z-index:2;left:50%;top:100%;transform:translateX(-50%);width:max-content;max-width:420px;
 background:#1f2328;color:#fff;text-align:left;font-weight:400;padding:6px 8px;border-radius:6px;font-size:12px;white-space:normal}
td.cell:hover .tip,td.cell:focus .tip,td.cell:focus-within .tip{display:block}
th.rot{height:140px;white-space:nowrap;vertical-align:bottom;padding:2px}
th.rot>div{transform:translate(6px,0) rotate(-60deg);transform-origin:left bottom;width:22px}
th.rot code{background:none;padding:0}
.problem{border-left:4px solid var(--line);padding:2px 10px;margin:10px 0}
.problem.s-fail{border-color:var(--fail)} .problem.s-warn{border-color:var(--warn)} .problem.s-error{border-color:var(--error)}
.hint{background:#ddf4ff;padding:4px 8px;border-radius:6px}
.caused{color:var(--skip)}
.reach td.cell{width:28px;height:22px;padding:0}
.r-ok{background:#dafbe1;color:var(--pass)} .r-refused,.r-unreachable{background:#ffebe9;color:var(--fail)}
.r-timed_out{background:#fff1e5;color:#bc4c00} .r-no_answer{background:#fff8c5;color:#7d4e00} .r-error{background:#fbefff;color:var(--error)} .r-self{background:#eee;color:#999}
.heat td.cell{width:44px;font-size:11px}
.legend span{margin-right:14px}
.small{color:#57606a;font-size:12px}
@media print{.tip{display:none!important} .scroll{overflow:visible} a{color:inherit} h2{break-after:avoid} details{display:block}}
"#;

pub fn html(m: &MergedReport) -> String {
    let mut s = String::with_capacity(64 << 10);
    let title = format!(
        "preflight: {} · {}",
        verdict_words(m),
        count(m.counts.nodes, "node")
    );
    let _ = write!(
        s,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><meta name=\"generator\" content=\"preflight {}\"><title>{}</title><style>{STYLE}</style></head><body><main>\n",
        escape(&m.tool.version),
        escape(&title)
    );
    header(&mut s, m);
    culprits(&mut s, m);
    problems(&mut s, m);
    matrix(&mut s, m);
    reachability(&mut s, m);
    collective(&mut s, m);
    sources(&mut s, m);
    s.push_str("</main></body></html>\n");
    s
}

/// Backquoted spans of a hint as code, the rest as text.
fn prose(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{}</code>", escape(part));
        } else {
            out.push_str(&escape(part));
        }
    }
    out
}

fn header(s: &mut String, m: &MergedReport) {
    let c = &m.counts;
    let _ = writeln!(
        s,
        "<header><h1>preflight cluster report</h1><p><span class=\"verdict v-{}\" id=\"verdict\">{} {}</span> exit code {} · {}: {} ready, {} not ready, {} incomplete</p><p class=\"small\">{} from {} to {} · preflight {}</p></header>",
        m.verdict.name(),
        match m.verdict {
            preflight_result::Verdict::Ready => "✓",
            preflight_result::Verdict::NotReady => "✗",
            preflight_result::Verdict::Incomplete => "?",
        },
        verdict_words(m),
        m.exit_code,
        count(c.nodes, "node"),
        c.ready,
        c.not_ready,
        c.incomplete,
        count(m.sources.len(), "report"),
        escape(&m.oldest_report_at),
        escape(&m.newest_report_at),
        escape(&m.tool.version)
    );
    for w in &m.warnings {
        let _ = writeln!(s, "<p class=\"small\">⚠ {}</p>", escape(w));
    }
}

fn culprits(s: &mut String, m: &MergedReport) {
    if m.culprits.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "<section id=\"culprits\"><h2>Culprits: {}</h2><table><thead><tr><th scope=\"col\">node</th><th scope=\"col\">ranks</th><th scope=\"col\">why</th></tr></thead><tbody>",
        count(m.culprits.len(), "node")
    );
    for c in &m.culprits {
        let _ = write!(
            s,
            "<tr class=\"culprit\"><th scope=\"row\">{}</th><td>{}</td><td>{}</td></tr>",
            escape(&c.node),
            rank_ranges(&c.ranks),
            c.reasons
                .iter()
                .map(|r| escape(r))
                .collect::<Vec<_>>()
                .join("<br>")
        );
    }
    s.push_str("</tbody></table></section>\n");
}

fn problems(s: &mut String, m: &MergedReport) {
    if m.problems.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "<section id=\"problems\"><h2>Problems: {}</h2>",
        count(m.problems.len(), "check")
    );
    for p in &m.problems {
        let _ = write!(
            s,
            "<div class=\"problem s-{st}\" id=\"problem-{id}\"><h3><span class=\"m\">{mk}</span> {up} <code>{id}</code></h3>",
            st = p.status.name(),
            id = escape(&p.id),
            mk = mark(p.status),
            up = p.status.name().to_uppercase()
        );
        if let Some(cause) = &p.caused_by {
            let _ = write!(
                s,
                "<p class=\"caused\">Caused by <a href=\"#problem-{c}\"><code>{c}</code></a>: fix that first.</p>",
                c = escape(cause)
            );
        }
        s.push_str("<ul>");
        for (node, message) in &p.nodes {
            let _ = write!(
                s,
                "<li><strong>{}</strong>: {}</li>",
                escape(node),
                escape(message)
            );
        }
        s.push_str("</ul>");
        if let Some(h) = &p.hint {
            let _ = write!(s, "<p class=\"hint\">Hint: {}</p>", prose(h));
        }
        s.push_str("</div>");
    }
    s.push_str("</section>\n");
}

fn matrix(s: &mut String, m: &MergedReport) {
    let _ = write!(
        s,
        "<section id=\"matrix\"><h2>Nodes × checks</h2><p class=\"legend small\"><span class=\"s-pass\"><span class=\"m\">✓</span>pass</span><span class=\"s-warn\"><span class=\"m\">!</span>warn</span><span class=\"s-fail\"><span class=\"m\">✗</span>fail</span><span class=\"s-error\"><span class=\"m\">?</span>error</span><span class=\"s-skip\"><span class=\"m\">–</span>skip</span><span><span class=\"m\">·</span>not failed (rank 0's summary lists failures only)</span>{}</p><div class=\"scroll\"><table class=\"matrix\"><thead><tr><th scope=\"col\">node</th><th scope=\"col\">ranks</th><th scope=\"col\">verdict</th>",
        if m.skipped_everywhere > 0 {
            format!(
                "<span>{} skipped on every node, not shown</span>",
                count(m.skipped_everywhere, "check")
            )
        } else {
            String::new()
        }
    );
    for id in &m.check_ids {
        let _ = write!(
            s,
            "<th scope=\"col\" class=\"rot\"><div><code>{}</code></div></th>",
            escape(id)
        );
    }
    s.push_str("</tr></thead><tbody>");
    for n in &m.nodes {
        row(s, m, n);
    }
    s.push_str("</tbody></table></div></section>\n");
}

fn row(s: &mut String, m: &MergedReport, n: &MergedNode) {
    // A node the cluster's findings name (unreachable, the culprit of a
    // comparison) says so in its row, whatever its own checks said: a
    // green row beside the finding would hide the node to act on.
    let named = m.culprits.iter().find(|c| c.node == n.name);
    // A straggler: one of its ranks is slow in every pair it is in.
    let slow: Vec<&str> = m
        .collective
        .iter()
        .filter(|c| c.straggler_ranks.iter().any(|r| n.ranks.contains(r)))
        .flat_map(|c| c.stragglers.iter().map(String::as_str))
        .collect();
    let (vs, verdict, tip) = match named {
        Some(c) if n.verdict == preflight_result::Verdict::Ready => (
            Status::Fail,
            "culprit".to_string(),
            format!(" title=\"{}\"", escape(&c.reasons.join("; "))),
        ),
        None if n.verdict == preflight_result::Verdict::Ready && !slow.is_empty() => (
            Status::Warn,
            "straggler".to_string(),
            format!(" title=\"{}\"", escape(&slow.join("; "))),
        ),
        _ => (
            verdict_status(n.verdict),
            n.verdict.name().to_string(),
            String::new(),
        ),
    };
    let _ = write!(
        s,
        "<tr id=\"node-{name}\" data-node=\"{name}\"><th scope=\"row\" title=\"{from}\">{name}</th><td>{ranks}</td><td class=\"cell s-{vs}\"{tip}>{vm} {v}</td>",
        name = escape(&n.name),
        from = escape(&n.from),
        ranks = rank_ranges(&n.ranks),
        vs = vs.name(),
        vm = mark(vs),
        v = verdict
    );
    for id in &m.check_ids {
        match n.checks.get(id) {
            Some(c) => {
                let mut tip = format!("{}: {}", c.status.name(), c.message);
                if let Some(cause) = &c.caused_by {
                    tip.push_str(&format!(" (caused by {cause})"));
                }
                let _ = write!(
                    s,
                    "<td class=\"cell s-{st}\" tabindex=\"0\" data-check=\"{id}\" aria-label=\"{node} {id}: {tipe}\"><span class=\"m\">{mk}</span><span class=\"tip\" role=\"tooltip\">{tipe}</span></td>",
                    st = c.status.name(),
                    id = escape(id),
                    node = escape(&n.name),
                    tipe = escape(&tip),
                    mk = mark(c.status)
                );
            }
            None if n.complete => {
                let _ = write!(s, "<td class=\"cell\" title=\"not run on this node\"></td>");
            }
            None => {
                let _ = write!(
                    s,
                    "<td class=\"cell\" title=\"not failed (rank 0's summary lists failures only)\"><span class=\"m\">·</span></td>"
                );
            }
        }
    }
    s.push_str("</tr>");
}

fn verdict_status(v: preflight_result::Verdict) -> Status {
    match v {
        preflight_result::Verdict::Ready => Status::Pass,
        preflight_result::Verdict::NotReady => Status::Fail,
        preflight_result::Verdict::Incomplete => Status::Error,
    }
}

fn reachability(s: &mut String, m: &MergedReport) {
    let Some(c) = &m.cluster else { return };
    let r = &c.reachability;
    if r.probes.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "<section id=\"reachability\"><h2>Reachability</h2><p class=\"small\">{}, {}; row: the prober, column: the node probed. <span class=\"r-ok\">✓ ok</span> <span class=\"r-refused\">R refused</span> <span class=\"r-timed_out\">T timed out (dropped)</span> <span class=\"r-no_answer\">N no answer (accepted, no echo)</span> <span class=\"r-unreachable\">U unreachable</span> <span class=\"r-error\">E error</span>, blank: not probed (mode)</p>",
        escape(&r.mode),
        count(r.probes.len(), "probe")
    );
    for f in &r.findings {
        let _ = write!(s, "<p>{}</p>", escape(f));
    }
    // Which nodes get a row and a column.
    let shown: Vec<usize> = if r.nodes.len() <= GRID {
        (0..r.nodes.len()).collect()
    } else {
        let mut v: Vec<usize> = r
            .probes
            .iter()
            .filter(|p| p.status != "ok")
            .flat_map(|p| [p.from, p.to])
            .collect();
        v.sort_unstable();
        v.dedup();
        v.truncate(GRID);
        let _ = write!(
            s,
            "<p class=\"small\">{}: only the nodes in a failed probe are drawn.</p>",
            count(r.nodes.len(), "node")
        );
        v
    };
    if shown.is_empty() {
        s.push_str("<p>Every probe reached its peer.</p></section>\n");
        return;
    }
    let mut grid: std::collections::HashMap<(usize, usize), &preflight_result::cluster::Probe> =
        std::collections::HashMap::new();
    for p in &r.probes {
        grid.insert((p.from, p.to), p);
    }
    let name = |i: usize| r.nodes.get(i).map_or("?".to_string(), |n| escape(n));
    s.push_str(
        "<div class=\"scroll\"><table class=\"reach\"><thead><tr><th scope=\"col\">from \\ to</th>",
    );
    for j in &shown {
        let _ = write!(s, "<th scope=\"col\">{}</th>", name(*j));
    }
    s.push_str("</tr></thead><tbody>");
    for i in &shown {
        let _ = write!(s, "<tr><th scope=\"row\">{}</th>", name(*i));
        for j in &shown {
            if i == j {
                s.push_str("<td class=\"cell r-self\">—</td>");
                continue;
            }
            match grid.get(&(*i, *j)) {
                Some(p) => {
                    let mk = match p.status.as_str() {
                        "ok" => "✓",
                        "refused" => "R",
                        "timed_out" => "T",
                        "no_answer" => "N",
                        "unreachable" => "U",
                        _ => "E",
                    };
                    let class = match p.status.as_str() {
                        "ok" | "refused" | "timed_out" | "no_answer" | "unreachable" => {
                            p.status.as_str()
                        }
                        _ => "error",
                    };
                    let mut tip = format!("{} → {}: {}", name(*i), name(*j), escape(&p.status));
                    if let Some(rtt) = p.rtt_ms {
                        tip.push_str(&format!(", {rtt:.2} ms"));
                    }
                    if let Some(d) = &p.detail {
                        tip.push_str(&format!(": {}", escape(d)));
                    }
                    let _ = write!(
                        s,
                        "<td class=\"cell r-{class}\" tabindex=\"0\" data-probe=\"{}\" aria-label=\"{tip}\"><span class=\"m\">{mk}</span><span class=\"tip\" role=\"tooltip\">{tip}</span></td>",
                        escape(&p.status)
                    );
                }
                None => s.push_str("<td class=\"cell\"></td>"),
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table></div></section>\n");
}

fn collective(s: &mut String, m: &MergedReport) {
    let Some(c) = &m.collective else { return };
    let _ = write!(
        s,
        "<section id=\"collective\"><h2>Collective ({}, {})</h2>",
        escape(&c.mode),
        count(c.world_size as usize, "rank")
    );
    for b in &c.backends {
        let st = match b.verdict.as_str() {
            "pass" => Status::Pass,
            "skip" => Status::Skip,
            "fail" => Status::Fail,
            _ => Status::Error,
        };
        let _ = write!(
            s,
            "<div class=\"backend\" id=\"backend-{n}\" data-backend=\"{n}\"><h3 class=\"s-{}\"><span class=\"m\">{}</span> {n}: {}</h3>",
            st.name(),
            mark(st),
            escape(&b.verdict),
            n = escape(&b.name)
        );
        if !b.available {
            let _ = write!(s, "<p>{}</p></div>", escape(&b.reason));
            continue;
        }
        if let Some(lib) = &b.library {
            let _ = write!(s, "<p class=\"small\">{}</p>", escape(lib));
        }
        for note in &b.notes {
            let _ = write!(s, "<p>{}</p>", escape(note));
        }
        for o in b.ops.iter().filter(|o| o.status != "verified") {
            let _ = write!(
                s,
                "<p class=\"s-fail\"><span class=\"m\">✗</span> {} {}: {}</p>",
                escape(&o.op),
                escape(&o.status),
                escape(o.detail.as_deref().unwrap_or(""))
            );
        }
        if let Some(e) = &b.ended {
            let _ = write!(s, "<p>Ended early: {}</p>", escape(e));
        }
        let thresholds: Vec<_> = m
            .thresholds
            .iter()
            .filter(|t| t.threshold.backend == b.name)
            .collect();
        if let Some(svg) = sweep_chart(&b.name, &b.sweep, &thresholds) {
            s.push_str("<figure>");
            s.push_str(&svg);
            let _ = write!(
                s,
                "<figcaption class=\"small\">{}: bus bandwidth by message size (nccl-tests' busbw); dashed horizontal lines: thresholds.</figcaption></figure>",
                escape(&b.name)
            );
            let _ = write!(
                s,
                "<details><summary>{} of the sweep</summary><table><thead><tr><th>op</th><th>size</th><th>time (µs)</th><th>algbw (GB/s)</th><th>busbw (GB/s)</th></tr></thead><tbody>",
                count(b.sweep.len(), "row")
            );
            for r in &b.sweep {
                let _ = write!(
                    s,
                    "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.3}</td><td>{:.3}</td></tr>",
                    r.op.name(),
                    preflight_ground::values::format_bytes(r.bytes as u64),
                    r.time_us,
                    r.algbw,
                    r.busbw
                );
            }
            s.push_str("</tbody></table></details>");
        }
        s.push_str("</div>");
    }
    heatmap(s, c);
    s.push_str("</section>\n");
}

/// Pair rates as a rank × rank table shaded by the fraction of the
/// fastest pair, the figure written in each cell.
fn heatmap(s: &mut String, c: &preflight_result::collective::CollectiveReport) {
    if c.pairs.is_empty() {
        return;
    }
    let _ = write!(s, "<div id=\"stragglers\"><h3>Pairs and stragglers</h3>");
    for x in &c.stragglers {
        let _ = write!(
            s,
            "<p class=\"s-warn\"><span class=\"m\">!</span> {}</p>",
            escape(x)
        );
    }
    if let Some(u) = &c.unjudged {
        let _ = write!(s, "<p class=\"small\">{}</p>", escape(u));
    }
    if let Some(sp) = &c.second_pass {
        second_pass(s, sp);
    }
    let best = c.pairs.iter().map(|p| p.gbps).fold(0.0_f64, f64::max);
    let world = c.world_size as usize;
    if world > GRID {
        let mut pairs = c.pairs.clone();
        pairs.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
        s.push_str("<p>Slowest pairs (GB/s each way):</p><ul>");
        for p in pairs.iter().take(20) {
            let _ = write!(s, "<li>{} ↔ {}: {:.3}</li>", p.a, p.b, p.gbps);
        }
        s.push_str("</ul></div>");
        return;
    }
    let mut rate = vec![vec![None; world]; world];
    for p in &c.pairs {
        let (a, b) = (p.a as usize, p.b as usize);
        if a < world && b < world {
            rate[a][b] = Some(p.gbps);
            rate[b][a] = Some(p.gbps);
        }
    }
    s.push_str("<p class=\"small\">GB/s each way between two ranks; darker is slower (a fraction of the fastest pair).</p><div class=\"scroll\"><table class=\"heat\"><thead><tr><th scope=\"col\">rank</th>");
    for j in 0..world {
        let _ = write!(s, "<th scope=\"col\">{j}</th>");
    }
    s.push_str("</tr></thead><tbody>");
    for (i, row) in rate.iter().enumerate() {
        let _ = write!(s, "<tr><th scope=\"row\">{i}</th>");
        for (j, v) in row.iter().enumerate() {
            match v {
                Some(g) if i != j => {
                    let f = if best > 0.0 {
                        (g / best).clamp(0.0, 1.0)
                    } else {
                        1.0
                    };
                    // Slow pairs dark red, fast ones pale: lightness by rate.
                    let light = 30.0 + 65.0 * f;
                    let fg = if light < 60.0 { "#fff" } else { "#1f2328" };
                    let _ = write!(
                        s,
                        "<td class=\"cell\" tabindex=\"0\" style=\"background:hsl(0,70%,{light:.0}%);color:{fg}\" aria-label=\"ranks {i} and {j}: {g:.3} GB/s\">{g:.2}<span class=\"tip\" role=\"tooltip\">ranks {i} ↔ {j}: {g:.3} GB/s ({:.0}% of the fastest pair)</span></td>",
                        f * 100.0
                    );
                }
                _ if i == j => s.push_str("<td class=\"cell r-self\">—</td>"),
                _ => s.push_str("<td class=\"cell\"></td>"),
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table></div></div>");
}

/// The pairwise round's second pass: why it ran or not, what it found
/// (slow nodes, slow links, suspects cleared, what was left out) and the
/// pairs it measured again.
fn second_pass(s: &mut String, sp: &preflight_result::collective::SecondPass) {
    let _ = write!(s, "<div id=\"second-pass\"><h4>Second pass</h4>");
    let took = if sp.ran {
        format!(" ({:.1} s)", sp.ms as f64 / 1000.0)
    } else {
        String::new()
    };
    let _ = write!(s, "<p>{}{took}</p>", escape(&sp.reason));
    let said = [
        ("s-warn", "!", "slow node", &sp.slow_nodes),
        ("s-warn", "!", "slow link", &sp.slow_links),
        ("s-pass", "✓", "cleared", &sp.cleared),
        ("s-skip", "–", "not confirmed", &sp.unconfirmed),
    ];
    for (class, mark, what, list) in said {
        for x in list {
            let _ = write!(
                s,
                "<p class=\"{class}\"><span class=\"m\">{mark}</span> {what}: {}</p>",
                escape(x)
            );
        }
    }
    if let Some(x) = &sp.skipped {
        let _ = write!(s, "<p class=\"small\">left out: {}</p>", escape(x));
    }
    if !sp.pairs.is_empty() {
        s.push_str("<table><thead><tr><th scope=\"col\">ranks</th><th scope=\"col\">GB/s each way, measured again</th></tr></thead><tbody>");
        for p in &sp.pairs {
            let _ = write!(
                s,
                "<tr><td>{} ↔ {}</td><td>{:.3}</td></tr>",
                p.a, p.b, p.gbps
            );
        }
        s.push_str("</tbody></table>");
    }
    s.push_str("</div>");
}

fn sources(s: &mut String, m: &MergedReport) {
    let _ = write!(
        s,
        "<section id=\"sources\"><h2>Sources</h2><table><thead><tr><th>file</th><th>command</th><th>host</th><th>rank</th><th>started</th><th>verdict</th><th>used for</th></tr></thead><tbody>"
    );
    for x in &m.sources {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&x.file),
            escape(&x.command),
            escape(&x.hostname),
            x.rank.map(|r| r.to_string()).unwrap_or_default(),
            escape(&x.started_at),
            x.verdict.name(),
            escape(&x.used_for)
        );
    }
    s.push_str("</tbody></table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            escape(r#"<script>"a" & 'b'</script>"#),
            "&lt;script&gt;&quot;a&quot; &amp; &apos;b&apos;&lt;/script&gt;"
        );
        assert_eq!(
            prose("run `kill <1>` now"),
            "run <code>kill &lt;1&gt;</code> now"
        );
    }
}

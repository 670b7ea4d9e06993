//! What is live: kproxy's chains as `iptables-save` prints them, and kproxy's own rules put in
//! that form, so a full sync over live rules (a restart, the hourly resync, the recovery after
//! a failed sync) restores only the chains that differ.
//!
//! `iptables-save` prints a rule in its own normalised form, the same for iptables-nft and
//! iptables-legacy (1.8.9; checked by the kernel tests of both): the address, interface and
//! protocol matches first (`-s`, `-d`, `-i`, `-o`, `-p`, each with its `!`), addresses with
//! their prefix length (`-d 10.0.0.1/32`), then the `-m` matches in the order they were
//! written, a comment quoted only when it holds more than letters, digits, `-` and `_`, the
//! options of some modules in an order and with defaults of their own (`recent`, `MARK`,
//! `REJECT`, `nfacct`, `statistic`'s probability as the kernel holds it). [`save_form`] writes
//! kproxy's rules that way (each rewrite means the same to the kernel); a rule it does not
//! know how to write only makes its chain look changed, so the worst a gap here costs is a
//! needless rewrite of that chain (see `adopt` in `sync.rs` for why that is not taken for
//! drift), never a missed one.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use kproxy_state::IpFamily;

use crate::cleanup::is_kproxy_chain;
use crate::rules::Table;

/// A digest of a chain's rules, in order, as `iptables-save` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainDigest {
    hash: u64,
    rules: usize,
}

/// Builds a [`ChainDigest`] rule by rule.
#[derive(Debug, Clone, Default)]
pub struct Digester {
    hasher: DefaultHasher,
    rules: usize,
}

impl Digester {
    /// Adds the next rule (a whole `-A CHAIN …` line in save form).
    pub fn rule(&mut self, line: &str) {
        line.hash(&mut self.hasher);
        self.rules += 1;
    }

    /// The digest of the rules added.
    pub fn finish(&self) -> ChainDigest {
        let mut h = self.hasher.clone();
        self.rules.hash(&mut h);
        ChainDigest { hash: h.finish(), rules: self.rules }
    }
}

/// The digest of kproxy's `rules` (restore lines) once in save form.
pub fn digest_of<S: AsRef<str>>(rules: &[S], family: IpFamily) -> ChainDigest {
    let mut d = Digester::default();
    for rule in rules {
        d.rule(&save_form(rule.as_ref(), family));
    }
    d.finish()
}

/// One table as `iptables-save -t <table>` printed it: a digest of each kproxy chain, and the
/// rules of the built-in chains (where kproxy's jumps are).
#[derive(Debug, Clone, Default)]
pub struct LiveTable {
    kproxy: HashMap<String, Digester>,
    builtin: HashMap<String, HashSet<String>>,
}

impl LiveTable {
    /// Reads the save output of `table`.
    pub fn parse(table: Table, save: &str) -> Self {
        let mut live = LiveTable::default();
        for line in save.lines() {
            live.line(table, line);
        }
        live
    }

    /// Reads `iptables-save` output of several tables (`*table` … `COMMIT` each): kproxy's
    /// tables, each empty when it is not there.
    pub fn parse_all(save: &str) -> BTreeMap<Table, LiveTable> {
        let mut tables: BTreeMap<Table, LiveTable> =
            Table::ALL.into_iter().map(|t| (t, LiveTable::default())).collect();
        let mut current = None;
        for line in save.lines() {
            if let Some(name) = line.strip_prefix('*') {
                current = Table::named(name.trim_end());
            } else if let Some(table) = current
                && let Some(live) = tables.get_mut(&table)
            {
                live.line(table, line);
            }
        }
        tables
    }

    fn line(&mut self, table: Table, line: &str) {
        if let Some(decl) = line.strip_prefix(':') {
            let mut words = decl.split_whitespace();
            let (Some(chain), Some(policy)) = (words.next(), words.next()) else { return };
            if is_kproxy_chain(table, chain) {
                self.kproxy.entry(chain.to_owned()).or_default();
            } else if policy != "-" {
                self.builtin.entry(chain.to_owned()).or_default();
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split_whitespace().next().unwrap_or("");
            if let Some(d) = self.kproxy.get_mut(chain) {
                d.rule(&single_spaced(line));
            } else if let Some(rules) = self.builtin.get_mut(chain) {
                rules.insert(single_spaced(line).into_owned());
            }
        }
    }

    /// Whether any of kproxy's chains is there.
    pub fn has_kproxy_chains(&self) -> bool {
        !self.kproxy.is_empty()
    }

    /// The digest of kproxy's `chain`, if it exists.
    pub fn digest(&self, chain: &str) -> Option<ChainDigest> {
        self.kproxy.get(chain).map(Digester::finish)
    }

    /// kproxy's chains that exist.
    pub fn kproxy_chains(&self) -> impl Iterator<Item = &str> {
        self.kproxy.keys().map(String::as_str)
    }

    /// Whether built-in `chain` holds `rule` (in save form).
    pub fn builtin_has(&self, chain: &str, rule: &str) -> bool {
        self.builtin.get(chain).is_some_and(|rules| rules.contains(rule))
    }
}

/// `line` with every run of spaces outside double quotes made one space, and none at the end:
/// `iptables-save` writes two spaces in places (`--nfacct-name  NAME`), which versions may
/// change, and [`save_form`] writes one.
fn single_spaced(line: &str) -> std::borrow::Cow<'_, str> {
    let line = line.trim_end();
    if !line.contains("  ") {
        return line.into();
    }
    let mut out = String::with_capacity(line.len());
    let mut quoted = false;
    let mut escaped = false;
    for c in line.chars() {
        if quoted {
            quoted = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            quoted = true;
        } else if c == ' ' && out.ends_with(' ') {
            continue;
        }
        out.push(c);
    }
    out.into()
}

/// A word of a rule, and whether it was quoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word<'a> {
    /// The word, without its quotes.
    pub text: &'a str,
    /// Whether it was a double-quoted string.
    pub quoted: bool,
}

/// Splits a restore or save line into words, a double-quoted string being one word (a quote
/// left open runs to the end of the line).
pub fn words(line: &str) -> Vec<Word<'_>> {
    let mut out = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('"') {
            // The closing quote is the first one not escaped: `xtables_save_string` escapes
            // `"`, `\` and `'` with a backslash.
            let mut escaped = false;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    let closing = !escaped && c == '"';
                    escaped = !escaped && c == '\\';
                    closing
                })
                .map_or(after.len(), |(i, _)| i);
            out.push(Word { text: &after[..end], quoted: true });
            rest = after.get(end + 1..).unwrap_or("").trim_start();
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            out.push(Word { text: &rest[..end], quoted: false });
            rest = rest[end..].trim_start();
        }
    }
    out
}

/// Appends `value` as libxtables' `xtables_save_string` does: bare when it is only letters,
/// digits, `-` and `_`, else double-quoted with `"`, `\` and `'` escaped.
fn push_save_string(out: &mut String, value: &str) {
    out.push(' ');
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        out.push_str(value);
        return;
    }
    out.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// An address or network as iptables prints it: with its prefix length, host bits cleared.
fn address(text: &str) -> String {
    let (ip, len) = match text.split_once('/') {
        Some((ip, len)) => (ip, len.parse::<u8>().ok()),
        None => (text, None),
    };
    let Ok(ip) = ip.parse::<IpAddr>() else { return text.to_owned() };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) if l <= max => l,
        Some(_) => return text.to_owned(),
        None => max,
    };
    match ipnet::IpNet::new(ip, len) {
        Ok(net) => format!("{}/{len}", net.network()),
        Err(_) => text.to_owned(),
    }
}

/// `statistic`'s probability as the kernel keeps it (`lround(p · 2³¹)`) and `iptables-save`
/// prints it (`%.11f` of that over 2³¹), computed exactly.
fn probability(text: &str) -> String {
    let Ok(p) = text.parse::<f64>() else { return text.to_owned() };
    if !(0.0..=1.0).contains(&p) {
        return text.to_owned();
    }
    const SCALE: u128 = 1 << 31;
    let k = (p * SCALE as f64).round() as u128;
    // k / 2³¹ to 11 decimals, the last rounded half to even (glibc's printf is exact).
    let scaled = k * 100_000_000_000;
    let (mut q, r) = (scaled / SCALE, scaled % SCALE);
    if 2 * r > SCALE || (2 * r == SCALE && q % 2 == 1) {
        q += 1;
    }
    format!("{}.{:011}", q / 100_000_000_000, q % 100_000_000_000)
}

/// Parses `0x…` or decimal.
fn number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The address, interface and protocol matches, in the order `iptables-save` prints them.
const BASE: [(&str, &str); 5] = [
    ("-s", "--source"),
    ("-d", "--destination"),
    ("-i", "--in-interface"),
    ("-o", "--out-interface"),
    ("-p", "--protocol"),
];

fn base_index(word: &Word<'_>) -> Option<usize> {
    if word.quoted {
        return None;
    }
    BASE.iter().position(|(short, long)| word.text == *short || word.text == *long)
}

/// kproxy's restore line `rule` (`-A CHAIN …`) in the form `iptables-save` prints it for
/// `family`. Lines it cannot read come back unchanged.
pub fn save_form(rule: &str, family: IpFamily) -> String {
    let w = words(rule);
    if w.len() < 2 || w[0].text != "-A" || w[0].quoted {
        return rule.to_owned();
    }
    let mut base: [Option<(bool, &str)>; 5] = [None; 5];
    let mut rest: Vec<&Word<'_>> = Vec::with_capacity(w.len());
    let mut i = 2;
    while i < w.len() {
        let negated = w[i].text == "!" && !w[i].quoted;
        let at = if negated { i + 1 } else { i };
        if let Some(b) = w.get(at).and_then(base_index)
            && let Some(value) = w.get(at + 1)
        {
            base[b] = Some((negated, value.text));
            i = at + 2;
            continue;
        }
        rest.push(&w[i]);
        i += 1;
    }
    let mut out = String::with_capacity(rule.len() + 32);
    out.push_str("-A ");
    out.push_str(w[1].text);
    for (b, value) in base.iter().enumerate() {
        let Some((negated, value)) = value else { continue };
        if *negated {
            out.push_str(" !");
        }
        out.push(' ');
        out.push_str(BASE[b].0);
        out.push(' ');
        if b < 2 {
            out.push_str(&address(value));
        } else {
            out.push_str(value);
        }
    }
    // The matches and the target, each with its options.
    let mut modules: Vec<(&str, Vec<&Word<'_>>)> = Vec::new();
    for word in rest {
        if !word.quoted && matches!(word.text, "-m" | "--match" | "-j" | "--jump" | "-g" | "--goto") {
            modules.push((word.text, Vec::new()));
        } else if let Some((_, opts)) = modules.last_mut() {
            opts.push(word);
        } else {
            // Nothing kproxy writes: keep it where it was.
            out.push(' ');
            out.push_str(word.text);
        }
    }
    for (flag, opts) in &modules {
        let Some((name, opts)) = opts.split_first() else {
            out.push(' ');
            out.push_str(flag);
            continue;
        };
        out.push(' ');
        out.push_str(flag);
        out.push(' ');
        out.push_str(name.text);
        let target = !matches!(*flag, "-m" | "--match");
        match (target, name.text) {
            (false, "recent") => recent(&mut out, opts, family),
            (false, "statistic") => statistic(&mut out, opts),
            (false, "nfacct") => nfacct(&mut out, opts),
            (true, "MARK") => mark(&mut out, opts),
            (true, "REJECT") if opts.is_empty() => out.push_str(match family {
                IpFamily::V4 => " --reject-with icmp-port-unreachable",
                IpFamily::V6 => " --reject-with icmp6-port-unreachable",
            }),
            _ => plain(&mut out, opts),
        }
    }
    out
}

fn plain(out: &mut String, opts: &[&Word<'_>]) {
    for o in opts {
        if o.quoted {
            push_save_string(out, o.text);
        } else {
            out.push(' ');
            out.push_str(o.text);
        }
    }
}

/// `--probability` as the kernel keeps it.
fn statistic(out: &mut String, opts: &[&Word<'_>]) {
    let mut iter = opts.iter().peekable();
    while let Some(o) = iter.next() {
        out.push(' ');
        out.push_str(o.text);
        if o.text == "--probability"
            && let Some(p) = iter.next()
        {
            out.push(' ');
            out.push_str(&probability(p.text));
        }
    }
}

/// `nfacct`: libxt_nfacct writes a space before the name and `xtables_save_string` another
/// (`--nfacct-name  NAME`; see [`LiveTable::parse`] for why that does not matter).
fn nfacct(out: &mut String, opts: &[&Word<'_>]) {
    let [flag, name] = opts else { return plain(out, opts) };
    if flag.text != "--nfacct-name" {
        return plain(out, opts);
    }
    out.push_str(" --nfacct-name");
    push_save_string(out, name.text);
}

/// `recent`: the command, `--seconds`, `--reap`, `--name`, the default `--mask` and
/// `--rsource`, in that order (libxt_recent's save).
fn recent(out: &mut String, opts: &[&Word<'_>], family: IpFamily) {
    let mut command = None;
    let mut seconds = None;
    let mut reap = false;
    let mut name = None;
    let mut mask = None;
    let mut side = "--rsource";
    let mut it = opts.iter();
    while let Some(o) = it.next() {
        match o.text {
            "--set" | "--rcheck" | "--update" | "--remove" => command = Some(o.text),
            "--seconds" => seconds = it.next().map(|w| w.text),
            "--reap" => reap = true,
            "--name" => name = it.next().map(|w| w.text),
            "--mask" => mask = it.next().map(|w| w.text),
            "--rsource" | "--rdest" => side = o.text,
            // Anything else kproxy never writes: keep the options as they were.
            _ => return plain(out, opts),
        }
    }
    let words = [
        command.map(str::to_owned),
        seconds.map(|s| format!("--seconds {s}")),
        reap.then(|| "--reap".to_owned()),
        Some(format!("--name {}", name.unwrap_or("DEFAULT"))),
        Some(format!(
            "--mask {}",
            mask.unwrap_or(match family {
                IpFamily::V4 => "255.255.255.255",
                IpFamily::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            })
        )),
        Some(side.to_owned()),
    ];
    for w in words.into_iter().flatten() {
        out.push(' ');
        out.push_str(&w);
    }
}

/// `MARK`: `--or-mark`, `--and-mark`, `--xor-mark`, `--set-mark` as the `--set-xmark
/// value/mask` the kernel keeps.
fn mark(out: &mut String, opts: &[&Word<'_>]) {
    let [op, value] = opts else { return plain(out, opts) };
    let Some(v) = number(value.text) else { return plain(out, opts) };
    let (value, mask) = match op.text {
        "--or-mark" => (v, v),
        "--and-mark" => (0, !v),
        "--xor-mark" => (v, 0),
        "--set-mark" => (v, u32::MAX),
        _ => return plain(out, opts),
    };
    out.push_str(&format!(" --set-xmark {value:#x}/{mask:#x}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kproxy's rules and what `iptables-save` of both backends printed for them (iptables
    /// 1.8.9, kernel 6.18).
    const V4: &[(&str, &str)] = &[
        (
            "-A KUBE-SVC-ABC -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 198.18.128.10 --dport 80 ! -s 198.18.16.0/20 -j KUBE-MARK-MASQ",
            "-A KUBE-SVC-ABC ! -s 198.18.16.0/20 -d 198.18.128.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ",
        ),
        (
            "-A KUBE-SVC-ABC -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 198.18.128.10 --dport 80 ! -i eth0 -j KUBE-MARK-MASQ",
            "-A KUBE-SVC-ABC -d 198.18.128.10/32 ! -i eth0 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ",
        ),
        (
            "-A KUBE-SVC-ABC -m comment --comment \"default/web:http -> 198.18.17.20:8080\" -s 198.18.17.20 -m statistic --mode random --probability 0.3333333333 -j MARK --or-mark 0x6000",
            "-A KUBE-SVC-ABC -s 198.18.17.20/32 -m comment --comment \"default/web:http -> 198.18.17.20:8080\" -m statistic --mode random --probability 0.33333333349 -j MARK --set-xmark 0x6000/0x6000",
        ),
        (
            "-A KUBE-SVC-ABC -m comment --comment \"default/web:http -> 198.18.17.20:8080\" -s 198.18.17.20 -m mark --mark 0x2000/0x2000 -p tcp -j DNAT --to-destination 198.18.17.20:8080",
            "-A KUBE-SVC-ABC -s 198.18.17.20/32 -p tcp -m comment --comment \"default/web:http -> 198.18.17.20:8080\" -m mark --mark 0x2000/0x2000 -j DNAT --to-destination 198.18.17.20:8080",
        ),
        (
            "-A KUBE-SVC-ABC -m comment --comment \"a\" ! -s 198.18.17.20 -m statistic --mode random --probability 0.2000000000 -p tcp -j DNAT --to-destination 198.18.17.20:8080",
            "-A KUBE-SVC-ABC ! -s 198.18.17.20/32 -p tcp -m comment --comment a -m statistic --mode random --probability 0.20000000019 -j DNAT --to-destination 198.18.17.20:8080",
        ),
        (
            "-A X -m statistic --mode random --probability 0.1428571429 -j RETURN",
            "-A X -m statistic --mode random --probability 0.14285714272 -j RETURN",
        ),
        (
            "-A X -m statistic --mode random --probability 0.0010000000 -j RETURN",
            "-A X -m statistic --mode random --probability 0.00100000016 -j RETURN",
        ),
        (
            "-A X -m statistic --mode random --probability 0.5000000000 -j RETURN",
            "-A X -m statistic --mode random --probability 0.50000000000 -j RETURN",
        ),
        (
            "-A KUBE-SVL-ABC -m comment --comment \"x\" -m recent --name KUBE-SEP-ABC --rcheck --seconds 10800 --reap -j KUBE-SEP-ABC",
            "-A KUBE-SVL-ABC -m comment --comment x -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-ABC --mask 255.255.255.255 --rsource -j KUBE-SEP-ABC",
        ),
        (
            "-A KUBE-SEP-ABC -m comment --comment \"default/web:http\" -m recent --name KUBE-SEP-ABC --set -m tcp -p tcp -j DNAT --to-destination 198.18.17.20:8080",
            "-A KUBE-SEP-ABC -p tcp -m comment --comment \"default/web:http\" -m recent --set --name KUBE-SEP-ABC --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 198.18.17.20:8080",
        ),
        (
            "-A KUBE-POSTROUTING -m comment --comment \"no masquerade to noMasqueradeCIDRs\" -m mark ! --mark 0x2000/0x2000 -m addrtype --src-type LOCAL ! -s 127.0.0.0/8 -d 10.0.0.0/8 -j RETURN",
            "-A KUBE-POSTROUTING ! -s 127.0.0.0/8 -d 10.0.0.0/8 -m comment --comment \"no masquerade to noMasqueradeCIDRs\" -m mark ! --mark 0x2000/0x2000 -m addrtype --src-type LOCAL -j RETURN",
        ),
        ("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000", "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0"),
        ("-A KUBE-POSTROUTING -j MARK --and-mark 0xffffdfff", "-A KUBE-POSTROUTING -j MARK --set-xmark 0x0/0x2000"),
        ("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000", "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"),
        (
            "-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        ),
        (
            "-A KUBE-SERVICES -m comment --comment \"cluster IP without a service on this port\" -d 198.18.128.10 -j REJECT",
            "-A KUBE-SERVICES -d 198.18.128.10/32 -m comment --comment \"cluster IP without a service on this port\" -j REJECT --reject-with icmp-port-unreachable",
        ),
        (
            "-A KUBE-EXTERNAL-SERVICES -m comment --comment \"d/w:h has no local endpoints\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -m udp -p udp --dport 30080 -j DROP",
            "-A KUBE-EXTERNAL-SERVICES ! -d 127.0.0.0/8 -p udp -m comment --comment \"d/w:h has no local endpoints\" -m addrtype --dst-type LOCAL -m udp --dport 30080 -j DROP",
        ),
        (
            "-A KUBE-FW-ABC -m comment --comment \"other traffic to default/web:http will be dropped by KUBE-PROXY-FIREWALL\"",
            "-A KUBE-FW-ABC -m comment --comment \"other traffic to default/web:http will be dropped by KUBE-PROXY-FIREWALL\"",
        ),
        (
            "-A KUBE-POSTROUTING -m comment --comment \"no masquerade to noMasqueradeCIDRs\" -m mark ! --mark 0x2000/0x2000 -i veth+ -d 10.0.0.0/8 -j RETURN",
            "-A KUBE-POSTROUTING -d 10.0.0.0/8 -i veth+ -m comment --comment \"no masquerade to noMasqueradeCIDRs\" -m mark ! --mark 0x2000/0x2000 -j RETURN",
        ),
        (
            "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
            "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        ),
        ("-A X -d 10.0.0.1/8 -j RETURN", "-A X -d 10.0.0.0/8 -j RETURN"),
        (
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP",
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP",
        ),
    ];

    const V6: &[(&str, &str)] = &[
        (
            "-A KUBE-SERVICES -m comment --comment \"default/web:http has no endpoints\" -m tcp -p tcp -d fd00:10::10 --dport 80 -j REJECT",
            "-A KUBE-SERVICES -d fd00:10::10/128 -p tcp -m comment --comment \"default/web:http has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable",
        ),
        (
            "-A KUBE-SERVICES -m comment --comment \"x\" -d fd00:10::1/64 -j DROP",
            "-A KUBE-SERVICES -d fd00:10::/64 -m comment --comment x -j DROP",
        ),
        ("-A KUBE-SERVICES -d 2001:db8:0:1::1 -j DROP", "-A KUBE-SERVICES -d 2001:db8:0:1::1/128 -j DROP"),
        (
            "-A KUBE-SEP-ABC -m comment --comment \"default/web:http\" -m recent --name KUBE-SEP-ABC --set -m tcp -p tcp -j DNAT --to-destination [fd00:17::20]:8080",
            "-A KUBE-SEP-ABC -p tcp -m comment --comment \"default/web:http\" -m recent --set --name KUBE-SEP-ABC --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -m tcp -j DNAT --to-destination [fd00:17::20]:8080",
        ),
        (
            "-A KUBE-SVC-ABC -m comment --comment \"x\" -m addrtype --src-type LOCAL ! -s ::1/128 -d fd00::/8 -j RETURN",
            "-A KUBE-SVC-ABC ! -s ::1/128 -d fd00::/8 -m comment --comment x -m addrtype --src-type LOCAL -j RETURN",
        ),
    ];

    #[test]
    fn kproxy_rules_in_save_form() {
        for (family, cases) in [(IpFamily::V4, V4), (IpFamily::V6, V6)] {
            for (rule, saved) in cases {
                assert_eq!(save_form(rule, family), *saved, "{rule}");
                // Save output is its own save form.
                assert_eq!(save_form(saved, family), *saved, "{saved}");
            }
        }
    }

    #[test]
    fn runs_of_spaces_outside_quotes_are_one() {
        assert_eq!(
            single_spaced("-A X -m nfacct --nfacct-name  n -m comment --comment \"a  \\\"b  \" -j RETURN  "),
            "-A X -m nfacct --nfacct-name n -m comment --comment \"a  \\\"b  \" -j RETURN"
        );
        let save = "*filter\n:KUBE-FORWARD - [0:0]\n\
            -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP\nCOMMIT\n";
        assert_eq!(
            LiveTable::parse(Table::Filter, save).digest("KUBE-FORWARD"),
            Some(digest_of(
                &[
                    "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
                ],
                IpFamily::V4
            ))
        );
    }

    #[test]
    fn comments_are_quoted_like_xtables_save_string() {
        let mut s = String::new();
        push_save_string(&mut s, "abc_D-1");
        push_save_string(&mut s, "a b");
        push_save_string(&mut s, "");
        push_save_string(&mut s, "it's");
        assert_eq!(s, " abc_D-1 \"a b\" \"\" \"it\\'s\"");
    }

    #[test]
    fn a_live_table_keeps_kproxy_chains_and_built_in_rules() {
        let save = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OTHER - [0:0]\n\
            :KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SVC-EMPTY - [0:0]\n\
            -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
            -A OTHER -j RETURN\n-A KUBE-SERVICES -d 198.18.0.1/32 -j KUBE-SVC-A\n-A KUBE-SVC-A -j RETURN\nCOMMIT\n";
        let live = LiveTable::parse(Table::Nat, save);
        assert!(live.has_kproxy_chains());
        let mut chains: Vec<&str> = live.kproxy_chains().collect();
        chains.sort_unstable();
        assert_eq!(chains, ["KUBE-SERVICES", "KUBE-SVC-A", "KUBE-SVC-EMPTY"]);
        assert_eq!(live.digest("KUBE-SVC-A"), Some(digest_of(&["-A KUBE-SVC-A -j RETURN"], IpFamily::V4)));
        assert_eq!(live.digest("KUBE-SVC-EMPTY"), Some(digest_of::<&str>(&[], IpFamily::V4)));
        assert_eq!(
            live.digest("KUBE-SERVICES"),
            Some(digest_of(&["-A KUBE-SERVICES -d 198.18.0.1 -j KUBE-SVC-A"], IpFamily::V4))
        );
        assert_ne!(live.digest("KUBE-SVC-A"), live.digest("KUBE-SVC-EMPTY"));
        assert_eq!(live.digest("OTHER"), None);
        assert!(live.builtin_has(
            "PREROUTING",
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        ));
        assert!(!LiveTable::parse(Table::Nat, "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").has_kproxy_chains());
    }

    #[test]
    fn a_save_of_every_table_is_read_table_by_table() {
        let save = "*raw\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n\
            *filter\n:INPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n-A INPUT -j KUBE-SERVICES\nCOMMIT\n\
            *nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n";
        let tables = LiveTable::parse_all(save);
        assert_eq!(tables.keys().copied().collect::<Vec<_>>(), Table::ALL.to_vec());
        let filter = &tables[&Table::Filter];
        assert_eq!(filter.digest("KUBE-SERVICES"), Some(digest_of(&["-A KUBE-SERVICES -j RETURN"], IpFamily::V4)));
        assert!(filter.builtin_has("INPUT", "-A INPUT -j KUBE-SERVICES"));
        assert_eq!(tables[&Table::Nat].digest("KUBE-SERVICES"), Some(digest_of::<&str>(&[], IpFamily::V4)));
        assert!(!tables[&Table::Mangle].has_kproxy_chains(), "raw is not read, mangle is not there");
    }
}

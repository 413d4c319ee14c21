#!/usr/bin/env python3
"""Module import circles inside Rust crates.

For each crate source folder given (`estimator/src`, `cli/src`, ...), reads the module tree from
`lib.rs` or `main.rs` (following `mod name;` and `#[path = ".."]`), collects every path a module
names (`use crate::a::B`, `crate::a::f()`, `super::b::C`, `use crate::{a::X, b::Y}`, and a crate
root re-export `crate::X` resolved to the module that defines `X`), and prints the circles among
sibling modules: modules `a` and `b` under the same parent are in a circle when something in `a`
(or below it) names something in `b` (or below it) and back, over any number of siblings.

What is not counted: comments (doc links are not imports), `#[cfg(test)]` modules and the
`#[cfg(test)] mod tests { .. }` blocks (tests may reach anywhere), and a module naming its parent
or its own children (a parent declares its children; a child uses its parent's items).

Usage: module_cycles.py [--quiet] <crate>/src ...
Prints each circle as `<crate>: a -> b -> c -> a` and exits 1 when there is one.
"""

import os
import re
import sys

MOD_DECL = re.compile(
    r'^\s*((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;',
    re.M,
)
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]')
CFG_TEST = re.compile(r'#\[cfg\((?:all\()?test')
USE_STMT = re.compile(r'\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);', re.S)
PATH_REF = re.compile(r'\b((?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)')


def strip_comments(text):
    """The text without comments, string literals emptied but for `#[path]`'s (keeps line breaks)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif text.startswith('/*', i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith('/*', i):
                    depth, i = depth + 1, i + 2
                elif text.startswith('*/', i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == '\n':
                        out.append('\n')
                    i += 1
        elif c == 'r' and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + '\n' * text.count('\n', i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            keep = re.search(r'#\[path\s*=\s*$', ''.join(out[-20:]))
            out.append(text[i:j + 1] if keep else '""' + '\n' * text.count('\n', i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\u{", i):
            j = text.find("'", i + 2)
            out.append("' '")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def drop_test_blocks(code):
    """The code without `#[cfg(test)]` items that have a body (`mod tests { .. }`, fns)."""
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code
        # the item after the attribute: up to its `;` or its balanced `{ .. }`
        i = code.find(']', m.end()) + 1
        j = i
        while j < len(code) and code[j] not in '{;':
            j += 1
        if j >= len(code) or code[j] == ';':
            code = code[:m.start()] + code[j + 1:]
            continue
        depth = 0
        while j < len(code):
            if code[j] == '{':
                depth += 1
            elif code[j] == '}':
                depth -= 1
                if depth == 0:
                    break
            j += 1
        code = code[:m.start()] + code[j + 1:]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs kept as the path)."""
    tree = re.sub(r'\s+', '', tree)
    tree = re.sub(r'\bas[A-Za-z_][A-Za-z0-9_]*', '', tree)

    def split_top(s):
        parts, depth, cur = [], 0, ''
        for ch in s:
            if ch == ',' and depth == 0:
                parts.append(cur)
                cur = ''
                continue
            depth += ch == '{'
            depth -= ch == '}'
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        k = s.find('{')
        if k < 0:
            return [prefix + s]
        head = s[:k]
        inner = s[k + 1:s.rfind('}')]
        res = []
        for p in split_top(inner):
            res += go(prefix + head, p) if p != 'self' else [(prefix + head).rstrip(':')]
        return res

    return [p.replace('::*', '').rstrip(':') for p in go('', tree)]


class Crate:
    def __init__(self, src):
        self.src = src.rstrip('/')
        self.name = os.path.basename(os.path.dirname(os.path.abspath(self.src)))
        root = next((f for f in ('lib.rs', 'main.rs') if os.path.isfile(os.path.join(self.src, f))), None)
        if root is None:
            raise SystemExit(f'{src}: no lib.rs or main.rs')
        self.files = {}  # module path (tuple) -> code without comments and tests
        self.walk((), os.path.join(self.src, root), True)
        self.reexports = self.root_reexports()

    def walk(self, path, file, owns_dir):
        with open(file, encoding='utf-8') as f:
            code = drop_test_blocks(strip_comments(f.read()))
        self.files[path] = code
        here = os.path.dirname(file)
        child_dir = here if owns_dir else os.path.join(here, os.path.splitext(os.path.basename(file))[0])
        for m in MOD_DECL.finditer(code):
            attrs, name = m.group(1), m.group(2)
            p = PATH_ATTR.search(attrs)
            if p:
                target = os.path.join(here, p.group(1))
                self.walk(path + (name,), target, os.path.basename(target) == 'mod.rs')
                continue
            for cand, owns in ((os.path.join(child_dir, name + '.rs'), False),
                               (os.path.join(child_dir, name, 'mod.rs'), True)):
                if os.path.isfile(cand):
                    self.walk(path + (name,), cand, owns)
                    break
            else:
                raise SystemExit(f'{file}: mod {name}: no file found')

    def root_reexports(self):
        """Names the crate root re-exports from one of its modules: `X` -> ('m',)."""
        out = {}
        for m in USE_STMT.finditer(self.files[()]):
            for p in expand_use(m.group(1)):
                segs = [s for s in p.split('::') if s and s != 'crate' and s != 'self']
                mod = self.longest_module(tuple(segs[:-1]))
                if segs and mod:
                    out[segs[-1]] = mod
        return out

    def longest_module(self, segs):
        for k in range(len(segs), 0, -1):
            if tuple(segs[:k]) in self.files:
                return tuple(segs[:k])
        return None

    def resolve(self, module, path):
        """The module a path written in `module` names, or None (outside the crate or the root)."""
        segs = path.split('::')
        if segs[0] == 'crate':
            base, rest = (), segs[1:]
        else:
            base = module
            rest = segs
            while rest and rest[0] in ('super', 'self'):
                if rest[0] == 'super':
                    base = base[:-1]
                rest = rest[1:]
        target = self.longest_module(base + tuple(rest)) if rest else None
        if target is None and base == () and rest:
            target = self.reexports.get(rest[0]) if len(rest) == 1 or (base + tuple(rest[:1])) not in self.files else None
        return target

    def edges(self):
        """(from module, to module) for every path one module names in another."""
        out = set()
        for module, code in self.files.items():
            paths = []
            for m in USE_STMT.finditer(code):
                paths += [p for p in expand_use(m.group(1)) if re.match(r'(crate|super|self)\b', p)]
            for m in PATH_REF.finditer(USE_STMT.sub('', code)):
                paths.append(re.sub(r'\s+', '', m.group(1)))
            for p in paths:
                t = self.resolve(module, p)
                if t is not None and t != module:
                    out.add((module, t))
        return out


def sibling_circles(crate):
    """Strongly connected groups (size > 1) of the sibling graphs, as lists of module paths."""
    graph = {}
    for a, b in crate.edges():
        # the siblings under the deepest common parent
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        if k == len(a) or k == len(b):
            continue  # parent and descendant
        sa, sb = a[:k + 1], b[:k + 1]
        graph.setdefault(sa, set()).add(sb)
        graph.setdefault(sb, set())
    # Tarjan
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps, graph


def main(argv):
    quiet = '--quiet' in argv
    srcs = [a for a in argv if a != '--quiet']
    if not srcs:
        print(__doc__.strip().split('\n\n')[-1], file=sys.stderr)
        return 2
    found = 0
    for src in srcs:
        crate = Crate(src)
        comps, graph = sibling_circles(crate)
        for comp in comps:
            found += 1
            names = ['::'.join(m) for m in comp]
            inner = {a: sorted(b for b in graph[a] if b in comp) for a in comp}
            detail = '; '.join(f"{'::'.join(a)} -> {', '.join('::'.join(b) for b in bs)}" for a, bs in inner.items())
            print(f'{crate.name}: circle of {len(comp)} modules: {", ".join(names)} ({detail})')
        if not comps and not quiet:
            print(f'{crate.name}: {len(crate.files)} modules, no circle')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

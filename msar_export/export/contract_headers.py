"""The C++ side of contracts.py: two headers generated from the op records and
committed, checked byte for byte by tests/test_plugins.py (regenerate with
`python -m msar_export.export.contract_headers plugins/`).

- common/msarKernelAttrs.h (C): the kernel-argument members each op's
  attributes become, spliced into MsarFusedMixerArgs / MsarDepthRetrievalArgs;
  msar_export.kernels.binding builds its ctypes fields from the same records.
- common/msarOpContracts.h (C++): names, fixed inputs, the creators'
  PluginField table, an attribute struct with the defaults, the field reader,
  the serialised fields and the copy into the kernel arguments.

It also renders each plugin README's attribute table.  So a new attribute reaches the parser, the creator, serialisation and the
kernel arguments from its Attr record alone; the kernel that reads it and the
plugin folder's validate() are the hand-written parts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..contracts import CONTRACTS, PLUGIN_NAMESPACE, PLUGIN_VERSION, Attr, OpContract

GENERATED = "Generated from msar_export/contracts.py by msar_export/export/contract_headers.py; do not edit."
KERNEL_ATTRS_H = "common/msarKernelAttrs.h"
OP_CONTRACTS_H = "common/msarOpContracts.h"

_KIND = {"INTS": "kINT32", "INT": "kINT32", "FLOAT": "kFLOAT32", "STRING": "kCHAR"}
_CTYPE = {"INT": "int32_t", "FLOAT": "float"}
_READ = {"INTS": "intsField", "INT": "scalarInt", "FLOAT": "scalarFloat"}


def _camel(name: str) -> str:
    return name[0].lower() + name[1:]


def _literal(a: Attr) -> str:
    if a.type == "FLOAT":
        return f"{a.default!r}F"
    return str(int(a.default))


def _kernel_macro(c: OpContract) -> list[str]:
    members = [f"    {t} {m};" for a in c.kernel_attributes for t, m in a.kernel_members()]
    return [f"/* {c.name}'s attributes as kernel arguments, in contract order. */",
            f"#define MSAR_{c.name.upper()}_ATTR_ARGS \\", *[m + " \\" for m in members[:-1]], members[-1], ""]


def render_kernel_attrs() -> str:
    out = [f"/* {GENERATED} */", "#ifndef MSAR_KERNEL_ATTRS_H", "#define MSAR_KERNEL_ATTRS_H", "",
           "#include <stdint.h>", ""]
    for c in CONTRACTS.values():
        if c.plugin:  # kernel arguments of the CUDA kernels' C ABI
            out += _kernel_macro(c)
    out += ["#endif /* MSAR_KERNEL_ATTRS_H */", ""]
    return "\n".join(out)


def _int64_mask(c: OpContract) -> int:
    """The fixed inputs the contract types int64, as bits (the ONNX Runtime kernels' port types)."""
    return sum(1 << i for i, p in enumerate(c.inputs) if p.dtype == "int64" and not p.variadic)


def _op_block(c: OpContract) -> list[str]:
    op, low = c.name, _camel(c.name)
    fixed = [p.name for p in c.inputs if not p.variadic]
    out = [f"// ---- {op} " + "-" * (70 - len(op)), "",
           f'constexpr char const* k{op}Name = "{op}";',
           f"constexpr int32_t k{op}FixedInputs = {c.n_fixed_inputs};",
           f"constexpr int32_t k{op}SinceVersion = {c.since};",
           f"constexpr uint32_t k{op}Int64Inputs = {_int64_mask(c)}u;  // bit i: input i is int64",
           "constexpr char const* const k" + op + "FixedInputNames[] = {" + ", ".join(f'"{n}"' for n in fixed) + "};", ""]
    if not c.plugin:  # no plugin creator: the name and the inputs are all the ONNX Runtime kernel needs
        return out
    out += ["//! The creator's PluginField table: ONNX attribute names and types, in contract order.",
            f"constexpr FieldSpec k{op}Fields[] = {{"]
    out += [f'    {{"{a.name}", FieldKind::{_KIND[a.type]}}},' for a in c.attributes]
    out += ["};", "", f"//! {op}'s kernel attributes with the contract's defaults (an empty list: required).",
            f"struct {op}AttrFields", "{"]
    for a in c.kernel_attributes:
        if a.type == "INTS":
            out.append(f"    std::vector<int32_t> {a.name};")
        else:
            out.append(f"    {_CTYPE[a.type]} {a.name}{{{_literal(a)}}};")
    out += [f"    bool operator==({op}AttrFields const&) const = default;", "};", "",
            "//! Reads field `f` into `a` if it names a kernel attribute; false for any other name.",
            f"inline bool read{op}Field(char const* op, {op}AttrFields& a, FieldView const& f)", "{"]
    for a in c.kernel_attributes:
        out += [f'    if (std::strcmp(f.name, "{a.name}") == 0)', "    {",
                f"        a.{a.name} = {_READ[a.type]}(op, f);", "        return true;", "    }"]
    out += ["    return false;", "}", "",
            "//! Every creator field for serialisation; the views point into `a`, which must outlive them.",
            f"inline std::vector<FieldView> {low}FieldsToSerialize({op}AttrFields const& a)", "{", "    return {"]
    for a in c.attributes:
        if a.type == "INTS":
            out.append(f'        {{"{a.name}", FieldKind::kINT32, a.{a.name}.data(), static_cast<int32_t>(a.{a.name}.size())}},')
        elif a.type == "STRING":
            out.append(f'        stringView("{a.name}", {_identity_constant(a)}),')
        else:
            out.append(f'        {{"{a.name}", FieldKind::{_KIND[a.type]}, &a.{a.name}, 1}},')
    out += ["    };", "}", "",
            f"//! The attributes into the kernel's MSAR_{op.upper()}_ATTR_ARGS members.",
            "template <typename Args>", f"void set{op}KernelAttrs(Args& args, {op}AttrFields const& a)", "{"]
    for a in c.kernel_attributes:
        if a.type == "INTS":
            out += [f"    args.{a.name} = a.{a.name}.data();",
                    f"    args.{a.count} = static_cast<int32_t>(a.{a.name}.size());"]
        else:
            out.append(f"    args.{a.name} = a.{a.name};")
    return out + ["}", ""]


def _identity_constant(a: Attr) -> str:
    names = {"plugin_version": "kPluginVersion", "plugin_namespace": "kPluginNamespace"}
    if a.name not in names:
        raise ValueError(f"STRING attribute {a.name}: only plugin_version / plugin_namespace are supported")
    return names[a.name]


def render_op_contracts() -> str:
    out = [f"// {GENERATED}", "#ifndef MSAR_OP_CONTRACTS_H", "#define MSAR_OP_CONTRACTS_H", "",
           '#include "msarPluginFields.h"', "", "#include <cstdint>", "#include <cstring>", "#include <vector>", "",
           "namespace msar", "{", "",
           f'constexpr char const* kPluginVersion = "{PLUGIN_VERSION}";',
           f'constexpr char const* kPluginNamespace = "{PLUGIN_NAMESPACE}";', ""]
    for c in CONTRACTS.values():
        out += _op_block(c)
    out += ["} // namespace msar", "", "#endif // MSAR_OP_CONTRACTS_H", ""]
    return "\n".join(out)


def render_headers() -> dict[str, str]:
    """{path under plugins/: text} of every generated header."""
    return {KERNEL_ATTRS_H: render_kernel_attrs(), OP_CONTRACTS_H: render_op_contracts()}


README = {"FusedMixer": "msarFusedMixerPlugin/README.md", "DepthRetrieval": "msarDepthRetrievalPlugin/README.md"}
TABLE_BEGIN = "<!-- attribute table: generated from msar_export/contracts.py (contract_headers.py) -->"
TABLE_END = "<!-- attribute table: end -->"


def render_attribute_table(c: OpContract) -> str:
    rows = [f"| `{a.name}` | {a.type} | {'required' if a.default is None else repr(a.default)} | {a.doc} |"
            for a in c.attributes]
    return "\n".join([TABLE_BEGIN, "| attribute | type | default | description |", "| --- | --- | --- | --- |",
                      *rows, TABLE_END])


def render_readmes(plugins: Path) -> dict[str, str]:
    """{path under plugins/: text} of each plugin README with its attribute table rendered
    from the contract (the rest of the README is written by hand)."""
    out = {}
    for op, rel in README.items():
        text = (plugins / rel).read_text()
        pattern = re.compile(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), re.S)
        if not pattern.search(text):
            raise ValueError(f"{rel}: no generated attribute table ({TABLE_BEGIN!r} ... {TABLE_END!r})")
        out[rel] = pattern.sub(lambda m: render_attribute_table(CONTRACTS[op]), text)
    return out


def write_headers(plugins: Path) -> list[Path]:
    """The generated headers and the READMEs' attribute tables."""
    written = []
    for rel, text in {**render_headers(), **render_readmes(plugins)}.items():
        path = plugins / rel
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_headers(Path(sys.argv[1] if len(sys.argv) > 1 else "plugins")):
        print(p)

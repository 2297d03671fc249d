/*
 * The plugins' own build-time rules, applied to msar nodes described on stdin
 * (no TensorRT, no CUDA): attribute parsing (the creator's field codec), the
 * type rule (checkOpTypes) and the shape rule (check*Shapes, exact=false as at
 * build time) of the plugin folders' rules. tests/test_rtx.py feeds it every
 * custom node of every exported graph:
 *   cmake --build BUILD --target nodeRules   (plugins/CMakeLists.txt)
 *
 * One node per line, fields separated by ';':
 *   OP;i NAME=v,v,...;f NAME=v;s NAME=text;t DTYPE D0xD1x...;t ...
 * (i: INT32 attribute, f: FLOAT32 attribute, s: string attribute, t: one input,
 * dims -1 when dynamic, "scalar" for rank 0). Prints one line per node:
 *   ok DTYPE D0xD1x...        the output type and shape the plugin would report
 *   error MESSAGE             the plugin's own message
 */
#include "msarDepthRetrievalPlugin/depthRetrievalRules.h"
#include "msarFusedMixerPlugin/fusedMixerRules.h"

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using namespace msar;

namespace
{
std::vector<std::string> split(std::string const& s, char sep)
{
    std::vector<std::string> out;
    std::string item;
    std::istringstream is(s);
    while (std::getline(is, item, sep))
    {
        out.push_back(item);
    }
    return out;
}

DType dtypeOf(std::string const& name)
{
    for (auto const& e : kDTypeTable)
    {
        if (name == e.name)
        {
            return e.type;
        }
    }
    return DType::kUNSUPPORTED;
}

Shape shapeOf(std::string const& text)
{
    Shape s;
    if (text == "scalar")
    {
        return s;
    }
    for (auto const& d : split(text, 'x'))
    {
        if (s.nbDims == kMaxRank)
        {
            fail("rank above ", kMaxRank);
        }
        s.d[s.nbDims++] = std::stoll(d);
    }
    return s;
}

std::string shapeText(std::vector<int64_t> const& dims)
{
    std::string out;
    for (size_t i = 0; i < dims.size(); ++i)
    {
        // Two appends: `"x" + std::to_string(...)` trips g++ 12's false -Wrestrict at -O3 (GCC bug 105329).
        out += i ? "x" : "";
        out += std::to_string(dims[i]);
    }
    return out;
}

struct Node
{
    std::string op;
    std::vector<std::string> names;
    std::vector<std::vector<int32_t>> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
    std::vector<FieldView> fields;
    std::vector<DType> types;
    std::vector<Shape> shapes;
};

// Storage first, views after, so no view points into a vector that grows.
void parseNode(std::string const& line, Node& n)
{
    auto const parts = split(line, ';');
    n.op = parts.at(0);
    struct Pending
    {
        char kind;
        size_t index;
    };
    std::vector<Pending> pending;
    n.ints.reserve(parts.size());
    n.floats.reserve(parts.size());
    n.strings.reserve(parts.size());
    for (size_t p = 1; p < parts.size(); ++p)
    {
        std::string const& f = parts[p];
        char const kind = f.at(0);
        std::string const body = f.substr(2);
        if (kind == 't')
        {
            auto const sp = body.find(' ');
            n.types.push_back(dtypeOf(body.substr(0, sp)));
            n.shapes.push_back(shapeOf(body.substr(sp + 1)));
            continue;
        }
        auto const eq = body.find('=');
        n.names.push_back(body.substr(0, eq));
        std::string const value = body.substr(eq + 1);
        if (kind == 'i')
        {
            std::vector<int32_t> v;
            for (auto const& x : split(value, ','))
            {
                v.push_back(static_cast<int32_t>(std::stol(x)));
            }
            n.ints.push_back(v);
            pending.push_back({'i', n.ints.size() - 1});
        }
        else if (kind == 'f')
        {
            n.floats.push_back(std::stof(value));
            pending.push_back({'f', n.floats.size() - 1});
        }
        else
        {
            n.strings.push_back(value);
            pending.push_back({'s', n.strings.size() - 1});
        }
    }
    for (size_t k = 0; k < pending.size(); ++k)
    {
        char const* name = n.names[k].c_str();
        auto const& p = pending[k];
        if (p.kind == 'i')
        {
            n.fields.push_back({name, FieldKind::kINT32, n.ints[p.index].data(),
                static_cast<int32_t>(n.ints[p.index].size())});
        }
        else if (p.kind == 'f')
        {
            n.fields.push_back({name, FieldKind::kFLOAT32, &n.floats[p.index], 1});
        }
        else
        {
            n.fields.push_back({name, FieldKind::kCHAR, n.strings[p.index].c_str(),
                static_cast<int32_t>(n.strings[p.index].size() + 1)});
        }
    }
}

std::string check(std::string const& line)
{
    Node n;
    parseNode(line, n);
    int32_t const nb = static_cast<int32_t>(n.shapes.size());
    std::vector<int64_t> out;
    if (n.op == kFusedMixerName)
    {
        auto const attrs = parseFusedMixerFields(n.fields.data(), static_cast<int32_t>(n.fields.size()));
        attrs.validate();
        auto const d = checkFusedMixerShapes(attrs, n.shapes.data(), nb, 1, /*exact=*/false);
        out = {d.batch, d.seq, d.d};
    }
    else if (n.op == kDepthRetrievalName)
    {
        auto const attrs = parseDepthRetrievalFields(n.fields.data(), static_cast<int32_t>(n.fields.size()));
        attrs.validate();
        auto const d = checkDepthRetrievalShapes(n.shapes.data(), nb, 1, /*exact=*/false);
        out = {d.batch, d.seq, d.m, d.d};
    }
    else
    {
        fail("unknown op ", n.op);
    }
    DType const t = checkOpTypes(n.op.c_str(), n.types.data(), nb);
    return std::string("ok ") + dtypeName(t) + " " + shapeText(out);
}
} // namespace

int main()
{
    std::string line;
    while (std::getline(std::cin, line))
    {
        if (line.empty())
        {
            continue;
        }
        try
        {
            std::cout << check(line) << "\n";
        }
        catch (std::exception const& e)
        {
            std::cout << "error " << e.what() << "\n";
        }
    }
    return 0;
}

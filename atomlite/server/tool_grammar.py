"""Grammars that force Gemma 4 tool calls, for tool_choice "required" or a named function: an EBNF (xgrammar's
dialect) of `<|tool_call>call:NAME{ARGS}<tool_call|>` whose ARGS, in Gemma 4's own notation (bare keys in
sorted order, strings between <|"|> delimiters), satisfy the tool's parameter schema.

The schema subset: type (string, integer, number, boolean, null, object, array, or a list of them), enum,
const, properties with required (optional ones may be left out), items, minItems/maxItems, minLength/maxLength,
anyOf/oneOf, and $ref into the schema's own $defs (or definitions), recursive ones included: what pydantic writes
for nested models. Anything else (a remote $ref, patterns, formats) is refused, so a forced call never promises a
shape the grammar does not enforce. Strings hold no "<" (which would open a delimiter); integers have at most 18
digits and fractions 16 (int64 and float64 hold no more), so a model cannot run on in digits."""
import json

from atomlite.server.parsers.gemma4_tools import CALL_PREFIX, STRING_DELIM, TOOL_CALL_END, TOOL_CALL_START, \
    render_value

SUPPORTED_KEYS = {"type", "enum", "const", "properties", "required", "items", "minItems", "maxItems", "minLength",
                  "maxLength", "anyOf", "oneOf", "description", "title", "default", "additionalProperties",
                  "examples", "$schema", "$ref", "$defs", "definitions"}
REF_PREFIXES = ("#/$defs/", "#/definitions/")
COMMON_RULES = r'''
string_char ::= [^<]
integer ::= "-"? ("0" | [1-9] [0-9]{0,17})
number ::= integer ("." [0-9]{1,16})? ([eE] [+-]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
any_string ::= DELIM string_char* DELIM
any_key ::= [A-Za-z_] [A-Za-z0-9_]*
any_value ::= any_string | number | boolean | null | any_object | any_array
any_object ::= "{" (any_key ":" any_value ("," any_key ":" any_value)*)? "}"
any_array ::= "[" (any_value ("," any_value)*)? "]"
'''


def literal(text: str) -> str:
    return json.dumps(text)  # JSON's string escapes are EBNF's


class ToolCallGrammar:
    """Builds the rules; each schema node gets a rule of its own, named after where it sits."""

    def __init__(self):
        self.rules: list[str] = []
        self.definitions: dict = {}  # the current tool's $defs
        self.prefix = ""  # the current tool's rule names start with it
        self._defined: dict[str, str] = {}  # $ref -> its rule

    def for_tool(self, schema: dict, prefix: str) -> None:
        self.definitions = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}
        self.prefix, self._defined = prefix, {}

    def reference(self, ref, name: str) -> str:
        """The rule of a $ref into the schema's own definitions, made once (a recursive one refers to itself)."""
        key = next((ref[len(p):] for p in REF_PREFIXES if isinstance(ref, str) and ref.startswith(p)), None)
        if key is None or key not in self.definitions:
            raise ValueError(f"{name}: $ref {ref!r} is not one of the schema's own $defs, so it cannot be enforced")
        if ref not in self._defined:
            rule = self._defined[ref] = f"{self.prefix}_def{len(self._defined)}"
            self.rule(rule, self.value(self.definitions[key], f"{rule}_value"))
        return self._defined[ref]

    def rule(self, name: str, body: str) -> str:
        self.rules.append(f"{name} ::= {body}")
        return name

    def value(self, schema: dict, name: str) -> str:
        """The rule for a value satisfying schema (Gemma 4 notation)."""
        if not isinstance(schema, dict):
            raise ValueError(f"{name}: a schema must be an object")
        unsupported = set(schema) - SUPPORTED_KEYS
        if unsupported:
            raise ValueError(f"{name}: {', '.join(sorted(unsupported))} cannot be enforced in a forced tool call")
        if "$ref" in schema:
            return self.reference(schema["$ref"], name)
        if "const" in schema:
            return self.rule(name, literal(render_value(schema["const"])))
        if "enum" in schema:
            return self.rule(name, " | ".join(literal(render_value(v)) for v in schema["enum"]))
        alternatives = schema.get("anyOf") or schema.get("oneOf")
        if alternatives:
            return self.rule(name, " | ".join(self.value(s, f"{name}_{i}") for i, s in enumerate(alternatives)))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.rule(name, " | ".join(self.value({**schema, "type": k}, f"{name}_{k}") for k in kind))
        if kind is None:
            return "any_value"
        return self._typed(kind, schema, name)

    def _typed(self, kind: str, schema: dict, name: str) -> str:
        if kind in ("integer", "number", "boolean", "null"):
            return kind
        if kind == "string":
            return self.rule(name, f"DELIM string_char{_repeat(schema, 'minLength', 'maxLength')} DELIM")
        if kind == "array":
            item = self.value(schema.get("items", {}), f"{name}_item")
            return self.rule(name, _array_body(item, schema.get("minItems", 0), schema.get("maxItems")))
        if kind == "object":
            return self.object(schema, name)
        raise ValueError(f"{name}: unknown type {kind!r}")

    def object(self, schema: dict, name: str) -> str:
        """Properties in sorted order (as the chat template writes them); optional ones may be left out."""
        properties = schema.get("properties")
        if not properties:
            return "any_object"
        required = set(schema.get("required", []))
        unknown = required - set(properties)
        if unknown:
            raise ValueError(f"{name}: required names {sorted(unknown)}, which are not among its properties")
        keys = sorted(properties)
        members = [self.rule(f"{name}_{i}", f"{literal(key + ':')} "
                                             f"{self.value(properties[key], f'{name}_{i}_value')}")
                   for i, key in enumerate(keys)]
        optional = [key not in required for key in keys]
        for i in reversed(range(len(keys))):  # rest_i: members from i on, after one was written
            after = f"{name}_rest{i + 1}" if i + 1 < len(keys) else '""'
            self.rule(f"{name}_rest{i}", f'("," {members[i]} {after})' + (f" | {after}" if optional[i] else ""))
        for i in reversed(range(len(keys))):  # first_i: members from i on, none written yet
            rest = f"{name}_rest{i + 1}" if i + 1 < len(keys) else '""'
            later = f"{name}_first{i + 1}" if i + 1 < len(keys) else '""'
            self.rule(f"{name}_first{i}", f"({members[i]} {rest})" + (f" | {later}" if optional[i] else ""))
        return self.rule(name, f'"{{" {name}_first0 "}}"')


def _repeat(schema: dict, low_key: str, high_key: str) -> str:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    if not low and high is None:
        return "*"
    return f"{{{low},{'' if high is None else high}}}"


def _array_body(item: str, low: int, high: int | None) -> str:
    if high == 0:
        return '"[" "]"'
    more_low = max(low - 1, 0)
    more_high = "" if high is None else high - 1
    tail = f'("," {item}){{{more_low},{more_high}}}'
    body = f'"[" {item} {tail} "]"'
    return body if low >= 1 else f'{body} | "[" "]"'


def tool_call_grammar(tools: list[dict], name: str | None = None, parallel: bool = True) -> str:
    """EBNF forcing one call of the named tool, or one call (parallel=False) or more of any of tools (OpenAI tool
    dicts: {"type": "function", "function": {"name", "parameters"}})."""
    grammar = ToolCallGrammar()
    calls = []
    for i, tool in enumerate(t["function"] for t in tools):
        if name is not None and tool["name"] != name:
            continue
        schema = tool.get("parameters") or {"type": "object"}
        grammar.for_tool(schema, f"tool{i}")
        try:
            args = grammar.object(schema, f"tool{i}_args") if schema.get("type", "object") == "object" else None
        except ValueError as e:
            raise ValueError(f"tool {tool['name']!r} parameters: {e}") from e
        if args is None:
            raise ValueError(f"tool {tool['name']!r} parameters: the arguments must be an object schema")
        calls.append(grammar.rule(f"call{i}", f"{literal(TOOL_CALL_START + CALL_PREFIX + tool['name'])} {args} "
                                              f"{literal(TOOL_CALL_END)}"))
    if not calls:
        raise ValueError(f"no tool named {name!r}")
    grammar.rule("call", " | ".join(calls))
    root = "root ::= call" + (" call*" if parallel and name is None else "")
    return "\n".join([root, *grammar.rules, f"DELIM ::= {literal(STRING_DELIM)}", COMMON_RULES.strip()])

// Python jinja2 3.1.6 semantics of the Jinja engine: each expected string is what jinja2 renders for
// the same template (checked with jinja2.Environment(extensions=['jinja2.ext.loopcontrols'])). Where
// Python would need a big int, lily reports an error naming the operation instead.
#include <string>

#include "common.h"

using namespace lily::text;
using namespace lily::text::testing;

TEST(JinjaSemantics, MacrosSeeThemselvesAndLaterNames) {
  EXPECT_EQ(render_str("{% macro f(n) %}{% if n < 3 %}{{ n }}{{ f(n+1) }}{% endif %}{% endmacro %}{{ f(0) }}"), "012");
  EXPECT_EQ(render_str("{% macro g() %}{{ f() }}{% endmacro %}{% macro f() %}F{% endmacro %}{{ g() }}"), "F");
  EXPECT_EQ(render_str("{% macro f() %}{{ x }}{% endmacro %}{% set x = 1 %}{{ f() }}"), "1");
  EXPECT_EQ(render_str("{% for i in [1, 2] %}{% macro f() %}{{ i }}{% endmacro %}{{ f() }}{% endfor %}"), "12");
  EXPECT_EQ(render_str("{% macro outer() %}{% macro inner(n) %}{% if n %}{{ n }}{{ inner(n - 1) }}{% endif %}"
                       "{% endmacro %}{{ inner(3) }}{% endmacro %}{{ outer() }}"),
            "321");
  EXPECT_EQ(render_str("{% macro even(n) %}{% if n == 0 %}E{% else %}{{ odd(n - 1) }}{% endif %}{% endmacro %}"
                       "{% macro odd(n) %}{% if n == 0 %}O{% else %}{{ even(n - 1) }}{% endif %}{% endmacro %}"
                       "{{ even(7) }}{{ even(8) }}"),
            "OE");
  EXPECT_EQ(render_str("{% macro f(f) %}{{ f }}{% endmacro %}{{ f(5) }}"), "5");  // a parameter shadows the macro
  EXPECT_EQ(render_str("{% macro box() %}[{{ caller() }}]{% endmacro %}{% for i in [1, 2] %}{% call box() %}{{ i }}"
                       "{% endcall %}{% endfor %}"),
            "[1][2]");
  // 41 levels: under the bound.
  EXPECT_EQ(render_str("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(40) | length }}"),
            "72");
}

TEST(JinjaSemantics, UnboundedMacroRecursionIsAnError) {
  std::string e = error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(0) }}");
  EXPECT_TRUE(contains(e, "macro 'f'")) << e;
  EXPECT_TRUE(contains(e, "64")) << e;
  e = error_of("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}");
  EXPECT_TRUE(contains(e, "nested deeper than 64")) << e;
}

TEST(JinjaSemantics, IntegerPower) {
  EXPECT_EQ(render_str("{{ (-1) ** 65 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 0 ** 0 }} {{ 2 ** -1 }} "
                       "{{ (-2) ** -3 }} {{ 2.0 ** 3 }} {{ 4 ** 0.5 }}"),
            "-1 4611686018427387904 -9223372036854775808 4052555153018976267 1 0.5 -0.125 8.0 2.0");
  EXPECT_TRUE(contains(error_of("{{ 2 ** 63 }}"), "integer overflow in **"));
  EXPECT_TRUE(contains(error_of("{{ 0 ** -1 }}"), "cannot be raised to a negative power"));
}

TEST(JinjaSemantics, IntegerOverflowAndDivision) {
  EXPECT_EQ(render_str("{{ 9223372036854775806 + 1 }} {{ -9223372036854775807 - 1 }} {{ -7 // 2 }} {{ -7 % 2 }} "
                       "{{ 7 % -2 }} {{ (-9223372036854775807 - 1) % -1 }} {{ 7 // -1 }}"),
            "9223372036854775807 -9223372036854775808 -4 1 -1 0 -7");
  EXPECT_EQ(render_str("{{ -9223372036854775807|abs }} {{ -3|abs }} {{ true|abs }}"), "9223372036854775807 3 1");
  EXPECT_TRUE(contains(error_of("{{ 9223372036854775807 + 1 }}"), "integer overflow in +"));
  EXPECT_TRUE(contains(error_of("{{ -9223372036854775807 - 2 }}"), "integer overflow in -"));
  EXPECT_TRUE(contains(error_of("{{ 3037000500 * 3037000500 }}"), "integer overflow in *"));
  EXPECT_TRUE(contains(error_of("{{ (-9223372036854775807 - 1) // -1 }}"), "integer overflow in //"));
  EXPECT_TRUE(contains(error_of("{{ -(-9223372036854775807 - 1) }}"), "integer overflow in unary -"));
  EXPECT_TRUE(contains(error_of("{{ (-9223372036854775807 - 1)|abs }}"), "integer overflow in abs"));
  EXPECT_TRUE(contains(error_of("{{ 5 // 0 }}"), "division by zero"));
  EXPECT_TRUE(contains(error_of("{{ 5 % 0 }}"), "modulo by zero"));
  EXPECT_TRUE(contains(error_of("{{ 5.0 % 0 }}"), "modulo by zero"));
}

TEST(JinjaSemantics, RoundHalfToEven) {
  EXPECT_EQ(render_str("{{ 2.5|round }} {{ 3.5|round }} {{ -2.5|round }} {{ 0.5|round }} {{ 2.675|round(2) }} "
                       "{{ 0.125|round(2) }} {{ 1.5|round(0) }} {{ 5|round }} {{ 1250|round(-2) }} {{ 1350|round(-2) }} "
                       "{{ 1234.5|round(-1) }}"),
            "2.0 4.0 -2.0 0.0 2.67 0.12 2.0 5 1200 1400 1230.0");
  EXPECT_EQ(render_str("{{ 2.1|round(method='ceil') }} {{ 2.9|round(method='floor') }} {{ -2.1|round(method='ceil') }} "
                       "{{ 2.123|round(2, 'ceil') }} {{ 5|round(method='floor') }} {{ 2.5|round(0, 'common') }} "
                       "{{ -0.4|round(method='ceil') }} {{ -0.4|round }}"),
            "3.0 2.0 -2.0 2.13 5.0 2.0 0.0 -0.0");
  EXPECT_TRUE(contains(error_of("{{ 1|round(method='x') }}"), "method must be common, ceil or floor"));
  EXPECT_TRUE(contains(error_of("{{ 'a'|round }}"), "round expects a number"));
}

TEST(JinjaSemantics, LoopControls) {
  // A for's else body runs outside that loop: break / continue there act on the enclosing loop.
  EXPECT_EQ(render_str("{% for y in [1, 2] %}{% for x in [] %}{% else %}{% break %}{% endfor %}{{ y }}{% endfor %}|"), "|");
  EXPECT_EQ(render_str("{% for y in [1, 2] %}{% for x in [] %}{% else %}{% continue %}{% endfor %}{{ y }}{% endfor %}|"),
            "|");
  EXPECT_EQ(render_str("{% for y in [1, 2, 3] %}{% if y == 2 %}{% continue %}{% endif %}{{ y }}{% endfor %}"), "13");
  EXPECT_EQ(render_str("{% for y in [1, 2, 3] %}{{ y }}{% filter upper %}{% if y == 2 %}{% break %}{% endif %}x"
                       "{% endfilter %}{% endfor %}"),
            "1X2");
  EXPECT_EQ(render_str("{% for y in [1, 2, 3] %}{% set s %}{% if y == 2 %}{% continue %}{% endif %}{{ y }}{% endset %}"
                       "{{ s }}{% endfor %}"),
            "13");
  EXPECT_EQ(render_str("{% for x in [] %}{% else %}empty{% endfor %}"), "empty");
}

TEST(JinjaSemantics, LoopControlsOutsideALoopAreSyntaxErrors) {
  std::string e = error_of("a{% break %}b");
  EXPECT_TRUE(contains(e, "t line 1, column")) << e;
  EXPECT_TRUE(contains(e, "{% break %} outside a for loop")) << e;
  e = error_of("a\n{% continue %}");
  EXPECT_TRUE(contains(e, "t line 2, column")) << e;
  EXPECT_TRUE(contains(e, "{% continue %} outside a for loop")) << e;
  EXPECT_TRUE(contains(error_of("{% for x in [] %}{% else %}{% break %}{% endfor %}"), "outside a for loop"));
  EXPECT_TRUE(contains(error_of("{% for y in [1] %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}"), "outside a for loop"));
  EXPECT_TRUE(contains(error_of("{% macro m() %}{{ caller() }}{% endmacro %}{% for y in [1] %}{% call m() %}{% continue %}"
                           "{% endcall %}{% endfor %}"),
                  "outside a for loop"));
}

TEST(JinjaSemantics, DictsortMinMaxSort) {
  EXPECT_EQ(render_str("{{ {'b': 1, 'A': 2, 'a': 3, 'B': 4}|dictsort|map('first')|join }}"), "AabB");
  EXPECT_EQ(render_str("{{ {'b': 1, 'A': 2, 'a': 3, 'B': 4}|dictsort(true)|map('first')|join }}"), "ABab");
  EXPECT_EQ(render_str("{{ {'b': 1, 'A': 2, 'a': 3, 'B': 4}|dictsort(false, 'value', true)|map('first')|join }}"), "BaAb");
  EXPECT_EQ(render_str("{{ {'x': 'b', 'y': 'A', 'z': 'a'}|dictsort(by='value')|map('first')|join }}"), "yzx");
  EXPECT_EQ(render_str("{{ {'x': 'b', 'y': 'A', 'z': 'a'}|dictsort(case_sensitive=true, by='value', reverse=true)"
                       "|map('first')|join }}"),
            "xzy");
  EXPECT_EQ(render_str("{% for k, v in {'b': 1, 'a': 2}|dictsort %}{{ k }}={{ v }};{% endfor %}"), "a=2;b=1;");
  EXPECT_TRUE(contains(error_of("{{ {'a': 1}|dictsort(by='x') }}"), "either 'key' or 'value'"));
  EXPECT_EQ(render_str("{{ ['b', 'A', 'a', 'B']|min }} {{ ['b', 'A', 'a', 'B']|max }} {{ ['b', 'a', 'B']|min(case_sensitive=true) }} "
                       "{{ ['b', 'A', 'c', 'B']|max(case_sensitive=true) }} {{ ['b', 'C', 'a']|max }}"),
            "A b B c C");
  EXPECT_EQ(render_str("{{ [{'x': 3}, {'x': 1}, {'x': 2}]|min(attribute='x') }} {{ [{'x': 'b'}, {'x': 'C'}]|max(attribute='x') }} "
                       "{{ [{'x': 'b'}, {'x': 'C'}]|max(true, 'x') }}"),
            "{'x': 1} {'x': 'C'} {'x': 'b'}");
  EXPECT_EQ(render_str("{{ ['b', 'A', 'a', 'B']|sort|join }} {{ ['b', 'A', 'a', 'B']|sort(case_sensitive=true)|join }} "
                       "{{ ['b', 'A', 'a', 'B']|sort(true)|join }}"),
            "AabB ABab bBAa");
  EXPECT_EQ(render_str("{{ [{'x': 'B'}, {'x': 'a'}]|sort(attribute='x')|map(attribute='x')|join }} "
                       "{{ [{'x': 'B'}, {'x': 'a'}]|sort(false, true, 'x')|map(attribute='x')|join }}"),
            "aB Ba");
}

TEST(JinjaSemantics, BooleansAreNumbersInArithmetic) {
  EXPECT_EQ(render_str("{{ True + 1 }} {{ -True }} {{ +True }} {{ True * 3 }} {{ True / 2 }} {{ True // 2 }} {{ True % 2 }} "
                       "{{ True ** 2 }} {{ True + True }} {{ True + 1.5 }} {{ False - True }} {{ 'ab' * True }}"),
            "2 -1 1 3 0.5 0 1 1 2 2.5 -1 ab");
  EXPECT_TRUE(contains(error_of("{{ true + none }}"), "boolean and none"));
}

TEST(JinjaSemantics, IntAndFloatFiltersParseLikePython) {
  EXPECT_EQ(render_str("{{ '0x1A'|int }} {{ '0x1A'|int(base=16) }} {{ '1A'|int(base=16) }} {{ '0b101'|int(base=0) }} "
                       "{{ '012'|int(base=8) }} {{ '0o12'|int(0, 8) }} {{ '012'|int(base=0) }} {{ ' 12 '|int }} "
                       "{{ '1_000'|int }} {{ '1__0'|int }} {{ '-5'|int }}"),
            "0 26 26 5 10 10 12 12 1000 0 -5");
  EXPECT_EQ(render_str("{{ '1.5'|int }} {{ '1e3'|int }} {{ '-2.9'|int }} {{ 'z'|int(7) }} {{ 'z'|int('q') }} "
                       "{{ 'nan'|int }} {{ 'inf'|int }} {{ 3.99|int }} {{ true|int }} {{ none|int }}"),
            "1 1000 -2 7 q 0 0 3 1 0");
  EXPECT_EQ(render_str("{{ '0x1A'|float }} {{ '0x1A'|float(1.5) }} {{ '1e3'|float }} {{ ' 2.5 '|float }} {{ 'inf'|float }} "
                       "{{ '-Infinity'|float }} {{ 'nan'|float }} {{ '1_0.5'|float }} {{ '1._5'|float }} {{ '.5'|float }} "
                       "{{ '5.'|float }} {{ 'e5'|float }} {{ 'x'|float('d') }} {{ 3|float }}"),
            "0.0 1.5 1000.0 2.5 inf -inf nan 10.5 0.0 0.5 5.0 0.0 d 3.0");
  // Python gives big ints here.
  EXPECT_TRUE(contains(error_of("{{ '99999999999999999999'|int }}"), "outside the 64-bit integer range"));
  EXPECT_TRUE(contains(error_of("{{ 1e300|int }}"), "outside the 64-bit integer range"));
}

//! One test per Sprig function or small family, on the outputs Sprig's documentation and Go
//! give. Where Go's exact output is not certain, the comment says so.

use serde_json::json;

use crate::GoTemplate;

fn render_with(source: &str, data: serde_json::Value) -> String {
    let template = GoTemplate::parse("t", source).unwrap_or_else(|e| panic!("{source}: {e}"));
    template
        .render(&data)
        .unwrap_or_else(|e| panic!("{source}: {e}"))
}

fn render(source: &str) -> String {
    render_with(source, json!({}))
}

/// The message a template fails with.
fn failure(source: &str) -> String {
    failure_with(source, json!({}))
}

fn failure_with(source: &str, data: serde_json::Value) -> String {
    let template = GoTemplate::parse("t", source).unwrap_or_else(|e| panic!("{source}: {e}"));
    match template.render(&data) {
        Ok(out) => panic!("{source}: rendered {out:?} instead of failing"),
        Err(e) => e.to_string(),
    }
}

/// Asserts each template renders its expected text.
fn check(cases: &[(&str, &str)]) {
    for (source, expected) in cases {
        assert_eq!(render(source), *expected, "{source}");
    }
}

#[test]
fn trim_family() {
    check(&[
        (r#"{{ trim "   hello    " }}"#, "hello"),
        (r#"{{ trim "\t\n x \u00a0" }}"#, "x"),
        (r#"{{ trimAll "$" "$5.00$" }}"#, "5.00"),
        (r#"{{ trimall "$" "$5.00" }}"#, "5.00"),
        (r#"{{ trimPrefix "-" "-hello" }}"#, "hello"),
        (r#"{{ trimSuffix "-" "hello-" }}"#, "hello"),
        (r#"{{ trimPrefix "x" "hello" }}"#, "hello"),
        (r#"{{ nospace "hello w o r l d" }}"#, "helloworld"),
    ]);
}

#[test]
fn case_family() {
    check(&[
        (r#"{{ upper "hello" }}"#, "HELLO"),
        (r#"{{ lower "HELLO" }}"#, "hello"),
        // Go maps one character to one: ß has no single upper-case character.
        (r#"{{ upper "straße" }}"#, "STRAßE"),
        (r#"{{ title "hello world" }}"#, "Hello World"),
        (
            r#"{{ title "hello-world o'neil x_y" }}"#,
            "Hello-World O'Neil X_y",
        ),
        (r#"{{ untitle "First Try" }}"#, "first try"),
        (r#"{{ swapcase "This Is A.Test" }}"#, "tHIS iS a.tEST"),
        (r#"{{ initials "First Try" }}"#, "FT"),
    ]);
}

#[test]
fn snakecase_and_kebabcase_split_words_as_xstrings() {
    let cases = [
        ("FirstName", "first_name"),
        ("HTTPServer", "http_server"),
        ("NoHTTPS", "no_https"),
        ("GO_PATH", "go_path"),
        ("GO PATH", "go_path"),
        ("GO-PATH", "go_path"),
        ("http2xx", "http_2xx"),
        ("HTTP2XX", "http2_xx"),
        ("HTTP20xOK", "http_20x_ok"),
        ("Duration2m3s", "duration_2m3s"),
        ("Bld4Floor3rd", "bld4_floor_3rd"),
        ("_camelCase", "_camel_case"),
        ("Wi_thF", "wi_th_f"),
        ("_AnotherTES_TCaseP", "_another_tes_t_case_p"),
        ("HELLO____WORLD", "hello____world"),
        ("  sentence case  ", "__sentence_case__"),
        (
            "FROM CamelCase to snake/kebab-case",
            "from_camel_case_to_snake/kebab_case",
        ),
        ("a1b2c3d", "a_1b2c3d"),
        ("abc_123_def", "abc_123_def"),
        ("", ""),
    ];
    for (input, snake) in cases {
        assert_eq!(
            render(&format!("{{{{ snakecase {input:?} }}}}")),
            snake,
            "{input}"
        );
        let kebab = snake.replace('_', "-");
        assert_eq!(
            render(&format!("{{{{ kebabcase {input:?} }}}}")),
            kebab,
            "{input}"
        );
    }
}

#[test]
fn camelcase_is_xstrings_pascal_case() {
    let cases = [
        ("http_server", "HttpServer"),
        ("_camel_case", "_CamelCase"),
        ("no_https", "NoHttps"),
        ("_complex__case_", "_Complex_Case_"),
        (" complex -case ", " Complex Case "),
        ("GOLANG_IS_GREAT", "GOLANGISGREAT"),
        ("a", "A"),
        (
            "FROM CamelCase to snake/kebab-case",
            "FROMCamelCaseToSnake/kebabCase",
        ),
        ("", ""),
    ];
    for (input, expected) in cases {
        assert_eq!(
            render(&format!("{{{{ camelcase {input:?} }}}}")),
            expected,
            "{input}"
        );
    }
}

#[test]
fn substr_and_trunc_cut_bytes_as_go() {
    check(&[
        (r#"{{ substr 0 5 "hello world" }}"#, "hello"),
        (r#"{{ "fooo" | substr 0 3 }}"#, "foo"),
        // An end past the string means "to the end"; a negative start means "from 0".
        (r#"{{ "foo" | substr 0 10 }}"#, "foo"),
        (r#"{{ "hello" | substr 2 -1 }}"#, "llo"),
        (r#"{{ "hello" | substr -1 2 }}"#, "he"),
        (r#"{{ trunc 5 "hello world" }}"#, "hello"),
        (r#"{{ trunc -5 "hello world" }}"#, "world"),
        (r#"{{ "baaaaaar" | trunc -999 }}"#, "baaaaaar"),
        (r#"{{ "baaaaaz" | trunc 0 }}"#, ""),
        // A cut inside a character: Go would keep half of it; gitplane writes U+FFFD.
        (r#"{{ "é" | trunc 1 }}"#, "\u{fffd}"),
    ]);
    // Bounds Go's slicing panics on are errors.
    assert!(failure(r#"{{ substr 3 1 "hello" }}"#).contains("substr: the start is after the end"));
    assert!(failure(r#"{{ substr 10 20 "hello" }}"#).contains("substr"));
    assert!(failure(r#"{{ substr -1 20 "hello" }}"#).contains("substr: the end is past"));
}

#[test]
fn abbrev_and_wrap() {
    check(&[
        (r#"{{ abbrev 5 "hello world" }}"#, "he..."),
        (r#"{{ abbrev 3 "hello world" }}"#, "hello world"),
        (r#"{{ abbrev 20 "hello world" }}"#, "hello world"),
        (r#"{{ abbrevboth 5 10 "1234 5678 9123" }}"#, "...5678..."),
        (r#"{{ wrap 5 "Hello World" }}"#, "Hello\nWorld"),
        (r#"{{ wrap 3 "Hello World" }}"#, "Hello\nWorld"),
        (r#"{{ wrapWith 5 "\t" "Hello World" }}"#, "Hello\tWorld"),
        (r#"{{ wrapWith 3 "|" "abcdefg" }}"#, "abc|def|g"),
    ]);
}

#[test]
fn repeat_is_bounded() {
    assert_eq!(render(r#"{{ repeat 3 "hello" }}"#), "hellohellohello");
    assert!(failure(r#"{{ repeat -1 "x" }}"#).contains("repeat: the count is negative"));
    let message = failure(r#"{{ repeat 100000000 "hello" }}"#);
    assert!(
        message.contains("repeat: the result would be longer than 16 MiB"),
        "{message}"
    );
}

#[test]
fn contains_and_prefixes() {
    check(&[
        (r#"{{ contains "cat" "catch" }}"#, "true"),
        (r#"{{ "catch" | contains "dog" }}"#, "false"),
        (r#"{{ hasPrefix "cat" "catch" }}"#, "true"),
        (r#"{{ hasSuffix "cat" "ducat" }}"#, "true"),
        (r#"{{ hasSuffix "cat" "catch" }}"#, "false"),
    ]);
}

#[test]
fn quote_squote_and_cat_skip_nil() {
    check(&[
        (r#"{{ quote "a" "b" "c" }}"#, r#""a" "b" "c""#),
        (r#"{{ quote "\"a\"" }}"#, r#""\"a\"""#),
        (r#"{{ quote 1 2 3 }}"#, r#""1" "2" "3""#),
        (r#"{{ quote "a\nb\t" }}"#, r#""a\nb\t""#),
        (r#"{{ .missing | quote }}"#, ""),
        (r#"{{ squote "a" "b" "c" }}"#, "'a' 'b' 'c'"),
        (r#"{{ squote 1 2 3 }}"#, "'1' '2' '3'"),
        (r#"{{ .missing | squote }}"#, ""),
        (
            r#"{{ cat "hello" "beautiful" "world" }}"#,
            "hello beautiful world",
        ),
        (r#"{{ $b := "b" }}{{ "c" | cat "a" $b }}"#, "a b c"),
        (r#"{{ .missing | cat "a" "b" }}"#, "a b"),
        (r#"{{ cat "n" 1 (list 1 2) }}"#, "n 1 [1 2]"),
    ]);
}

#[test]
fn indent_and_nindent_indent_every_line() {
    check(&[
        (r#"{{ indent 4 "a\nb\nc" }}"#, "    a\n    b\n    c"),
        (r#"{{ nindent 4 "a\nb\nc" }}"#, "\n    a\n    b\n    c"),
        (r#"{{ "x" | indent 0 }}"#, "x"),
    ]);
    let message = failure(r#"{{ $s := repeat 1000000 "\n" }}{{ indent 100 $s }}"#);
    assert!(
        message.contains("indent: the result would be longer"),
        "{message}"
    );
}

#[test]
fn replace_and_plural() {
    check(&[
        (
            r#"{{ "I Am Henry VIII" | replace " " "-" }}"#,
            "I-Am-Henry-VIII",
        ),
        (r#"{{ replace "" "-" "abc" }}"#, "-a-b-c-"),
        (
            r#"{{ $n := len "two" }}{{ $n }} {{ $n | plural "1 char" "chars" }}"#,
            "3 chars",
        ),
        (r#"{{ len "t" | plural "cheese" "%d chars" }}"#, "cheese"),
    ]);
}

#[test]
fn to_string_prints_as_go_percent_v() {
    check(&[
        ("{{ toString 5 }}", "5"),
        ("{{ toString .missing }}", "<nil>"),
        ("{{ toString true }}", "true"),
        ("{{ toString 1.5 }}", "1.5"),
        // fmt's %v is strconv's shortest 'g': an exponent from 1e6 and below 1e-4.
        ("{{ toString 1000000.0 }}", "1e+06"),
        ("{{ toString 123456.0 }}", "123456"),
        ("{{ toString 0.00001 }}", "1e-05"),
        (r#"{{ toString (list 1 "a" .missing) }}"#, "[1 a <nil>]"),
        (
            r#"{{ toString (dict "b" 2 "a" (list 1)) }}"#,
            "map[a:[1] b:2]",
        ),
        ("{{ list 1 .missing 2 | toStrings }}", "[1 2]"),
        (
            r#"{{ $s := list 1 2 3 | toStrings }}{{ index $s 1 | kindOf }}"#,
            "string",
        ),
    ]);
}

#[test]
fn split_family() {
    check(&[
        (
            r#"{{ $v := "foo$bar$baz" | split "$" }}{{ $v._0 }} {{ $v._2 }}"#,
            "foo baz",
        ),
        (
            r#"{{ $v := "foo$bar$baz" | splitn "$" 2 }}{{ $v._1 }}"#,
            "bar$baz",
        ),
        (r#"{{ splitList "." "a.b.c" }}"#, "[a b c]"),
        (r#"{{ splitList "," "" | len }}"#, "1"),
        (r#"{{ splitList "" "abc" }}"#, "[a b c]"),
        (r#"{{ splitn "" 2 "abc" }}"#, "map[_0:a _1:bc]"),
        (
            r#"{{ index (splitList "." "modules.web.externals.db") 1 }}"#,
            "web",
        ),
    ]);
}

#[test]
fn join_and_sort_alpha() {
    check(&[
        (r#"{{ list "a" "b" "c" | join "-" }}"#, "a-b-c"),
        ("{{ tuple 1 2 3 | join \"-\" }}", "1-2-3"),
        (r#"{{ join "-" "abc" }}"#, "abc"),
        (r#"{{ join "-" (list "1" .missing "2") }}"#, "1-2"),
        (r#"{{ join "-" .missing }}"#, ""),
        (r#"{{ list "c" "a" "b" | sortAlpha | join "" }}"#, "abc"),
        ("{{ list 2 1 4 3 | sortAlpha | join \"\" }}", "1234"),
        (r#"{{ sortAlpha "x" }}"#, "[x]"),
    ]);
}

#[test]
fn regex_family_uses_go_syntax() {
    check(&[
        (r#"{{ regexMatch "^[a-z0-9-]+$" "web-1" }}"#, "true"),
        (
            r#"{{ regexMatch "modules\\.[a-z0-9-]+\\.externals" "modules.web.externals.db" }}"#,
            "true",
        ),
        // An invalid pattern does not match (mustRegexMatch fails instead).
        (r#"{{ regexMatch "[" "x" }}"#, "false"),
        (
            r#"{{ regexFindAll "[2,4,6,8]" "123456789" -1 }}"#,
            "[2 4 6 8]",
        ),
        (r#"{{ regexFindAll "[2,4,6,8]" "123456789" 1 }}"#, "[2]"),
        (r#"{{ regexFindAll "x" "123" -1 | len }}"#, "0"),
        (r#"{{ regexFind "[a-zA-Z][1-9]" "abcd1234" }}"#, "d1"),
        (
            r#"{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "${1}W" }}"#,
            "-W-xxW-",
        ),
        (r#"{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "$1W" }}"#, "---"),
        (
            r#"{{ regexReplaceAllLiteral "a(x*)b" "-ab-axxb-" "${1}" }}"#,
            "-${1}-${1}-",
        ),
        (r#"{{ regexReplaceAll "a*" "baaac" "X" }}"#, "XbXcX"),
        (r#"{{ regexSplit "z+" "pizza" -1 }}"#, "[pi a]"),
        (r#"{{ regexSplit "z+" "pizza" 1 }}"#, "[pizza]"),
        (r#"{{ regexSplit "" "abc" -1 }}"#, "[a b c]"),
        (r#"{{ regexQuoteMeta "1.2+3" }}"#, "1\\.2\\+3"),
        // Go's \d, \w and \b are ASCII only.
        (r#"{{ regexMatch "^\\d+$" "١٢٣" }}"#, "false"),
        (r#"{{ regexMatch "^\\w+$" "é" }}"#, "false"),
        (r#"{{ regexMatch "^[\\d_]+$" "1_2" }}"#, "true"),
        // `[` is a plain character inside a class in Go.
        (r#"{{ regexMatch "^[[]$" "[" }}"#, "true"),
        (r#"{{ regexMatch "\\Qa.b\\E" "a.b" }}"#, "true"),
        (r#"{{ regexMatch "\\Qa.b\\E" "axb" }}"#, "false"),
    ]);
    let message = failure(r#"{{ mustRegexMatch "[" "x" }}"#);
    assert!(
        message.contains(r#"mustRegexMatch: "[" is not a regular expression"#),
        "{message}"
    );
    assert!(failure(r#"{{ regexFind "(" "x" }}"#).contains("regexFind"));
}

#[test]
fn random_strings_have_the_asked_length_and_alphabet() {
    let out = render(
        "{{ randAlphaNum 64 }}\n{{ randAlpha 64 }}\n{{ randNumeric 64 }}\n{{ randAscii 64 }}",
    );
    let parts: Vec<&str> = out.split('\n').collect();
    assert_eq!(parts.len(), 4, "{out}");
    assert!(parts[0].len() == 64 && parts[0].chars().all(|c| c.is_ascii_alphanumeric()));
    assert!(parts[1].len() == 64 && parts[1].chars().all(|c| c.is_ascii_alphabetic()));
    assert!(parts[2].len() == 64 && parts[2].chars().all(|c| c.is_ascii_digit()));
    assert!(parts[3].len() == 64 && parts[3].chars().all(|c| (' '..='~').contains(&c)));
    assert_ne!(
        render("{{ randAlphaNum 32 }}"),
        render("{{ randAlphaNum 32 }}")
    );
    check(&[("{{ randAlphaNum 0 }}", ""), ("{{ randAlpha -3 }}", "")]);
    assert!(failure("{{ randAlphaNum 100000000 }}").contains("longer than 16 MiB"));

    let uuid = render("{{ uuidv4 }}");
    let shape =
        regex::Regex::new("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
            .unwrap();
    assert!(shape.is_match(&uuid), "{uuid}");

    let mut shuffled: Vec<char> = render(r#"{{ shuffle "hello" }}"#).chars().collect();
    shuffled.sort_unstable();
    assert_eq!(shuffled.into_iter().collect::<String>(), "ehllo");
    for _ in 0..20 {
        let n = render("{{ randInt 1 3 }}");
        assert!(n == "1" || n == "2", "{n}");
    }
    assert_eq!(render("{{ randBytes 12 | len }}"), "16");
    assert!(failure("{{ randInt 3 3 }}").contains("randInt"));
}

#[test]
fn integer_arithmetic_converts_as_cast() {
    check(&[
        ("{{ add 1 2 3 }}", "6"),
        ("{{ add }}", "0"),
        (r#"{{ add "1" 2.9 true }}"#, "4"),
        ("{{ add1 5 }}", "6"),
        ("{{ sub 5 3 }}", "2"),
        ("{{ mul 2 3 4 }}", "24"),
        ("{{ div 7 2 }}", "3"),
        ("{{ div -7 2 }}", "-3"),
        ("{{ mod 7 3 }}", "1"),
        ("{{ max 1 5 3 }}", "5"),
        ("{{ biggest 1 5 3 }}", "5"),
        ("{{ min 4 2 9 }}", "2"),
        ("{{ add 9223372036854775807 1 }}", "-9223372036854775808"),
    ]);
    assert!(failure("{{ div 1 0 }}").contains("div: division by zero"));
    assert!(failure("{{ mod 1 0 }}").contains("mod: division by zero"));
}

#[test]
fn conversions() {
    check(&[
        (r#"{{ int "12" }}"#, "12"),
        ("{{ int 3.9 }}", "3"),
        (r#"{{ int "12.7" }}"#, "12"),
        (r#"{{ int "0x1F" }}"#, "31"),
        // Go's integer literal rules: a leading 0 is octal.
        (r#"{{ int "012" }}"#, "10"),
        (r#"{{ int "1_000" }}"#, "1000"),
        (r#"{{ int "abc" }}"#, "0"),
        (r#"{{ int "" }}"#, "0"),
        ("{{ int true }}", "1"),
        ("{{ int .missing }}", "0"),
        (r#"{{ int64 "-42" }}"#, "-42"),
        (r#"{{ float64 "1.5" }}"#, "1.5"),
        (r#"{{ float64 "x" }}"#, "0"),
        ("{{ float64 2 }}", "2"),
        (r#"{{ atoi "42" }}"#, "42"),
        (r#"{{ atoi "4.2" }}"#, "0"),
        (r#"{{ atoi "0x1F" }}"#, "0"),
        (r#"{{ toDecimal "0777" }}"#, "511"),
        (r#"{{ toDecimal "9" }}"#, "0"),
    ]);
}

#[test]
fn float_functions() {
    check(&[
        ("{{ floor 1.7 }}", "1"),
        ("{{ ceil 1.2 }}", "2"),
        ("{{ round 123.555555 3 }}", "123.556"),
        ("{{ round 123.5555 3 0.6 }}", "123.555"),
        // Through exact decimals, as shopspring/decimal: not 3.3000000000000003.
        ("{{ addf 1.1 2.2 }}", "3.3"),
        ("{{ add1f 1.1 }}", "2.1"),
        ("{{ subf 1.5 0.5 0.25 }}", "0.75"),
        ("{{ mulf 1.1 3 }}", "3.3"),
        ("{{ divf 10 4 }}", "2.5"),
        ("{{ maxf 1 2.5 2 }}", "2.5"),
        ("{{ minf 1 2.5 -0.5 }}", "-0.5"),
    ]);
}

#[test]
fn until_until_step_and_seq() {
    check(&[
        ("{{ until 5 }}", "[0 1 2 3 4]"),
        ("{{ until -3 }}", "[0 -1 -2]"),
        ("{{ untilStep 3 6 2 }}", "[3 5]"),
        ("{{ untilStep 6 3 -1 }}", "[6 5 4]"),
        ("{{ untilStep 0 10 -1 }}", "[]"),
        ("{{ seq 5 }}", "1 2 3 4 5"),
        ("{{ seq -3 }}", "1 0 -1 -2 -3"),
        ("{{ seq 0 2 }}", "0 1 2"),
        ("{{ seq 2 -2 }}", "2 1 0 -1 -2"),
        ("{{ seq 0 2 10 }}", "0 2 4 6 8 10"),
        ("{{ seq 0 -2 -5 }}", "0 -2 -4"),
        ("{{ seq }}", ""),
    ]);
    let message = failure("{{ until 100000000 }}");
    assert!(
        message.contains("until: the list would have more than 1000000 items"),
        "{message}"
    );
    assert!(failure("{{ seq 100000000 }}").contains("seq"));
}

#[test]
fn defaults_and_emptiness() {
    check(&[
        (r#"{{ default "foo" .missing }}"#, "foo"),
        (r#"{{ .missing | default "foo" }}"#, "foo"),
        (r#"{{ default "foo" "" }}"#, "foo"),
        (r#"{{ default "foo" 0 }}"#, "foo"),
        (r#"{{ default "foo" false }}"#, "foo"),
        (r#"{{ default "foo" (list) }}"#, "foo"),
        (r#"{{ default "foo" (dict) }}"#, "foo"),
        (r#"{{ default "foo" "bar" }}"#, "bar"),
        (r#"{{ default "foo" 1 }}"#, "1"),
        (r#"{{ default "foo" }}"#, "foo"),
        (
            r#"{{ empty "" }} {{ empty 0 }} {{ empty .missing }} {{ empty (list 1) }}"#,
            "true true true false",
        ),
        (r#"{{ coalesce 0 "" .missing "x" "y" }}"#, "x"),
        ("{{ coalesce 0 }}", "<no value>"),
        (r#"{{ all 1 "a" true }} {{ all 1 "" }}"#, "true false"),
        (
            r#"{{ any 0 "" "a" }} {{ any 0 "" }} {{ any }}"#,
            "true false false",
        ),
        (
            r#"{{ ternary "a" "b" true }} {{ ternary "a" "b" false }}"#,
            "a b",
        ),
        (r#"{{ true | ternary "yes" "no" }}"#, "yes"),
    ]);
    let message = failure(r#"{{ ternary "a" "b" "x" }}"#);
    assert!(
        message.contains("ternary: the 3rd argument must be a bool, not a string"),
        "{message}"
    );
}

#[test]
fn fail_and_required() {
    assert_eq!(failure(r#"{{ fail "boom" }}"#), "t, line 1: fail: boom");
    assert_eq!(
        failure("x\n{{ required \"port is required\" .port }}"),
        "t, line 2: required: port is required"
    );
    assert!(failure(r#"{{ required "need it" "" }}"#).contains("need it"));
    check(&[
        (r#"{{ required "need it" "v" }}"#, "v"),
        (r#"{{ required "need it" 0 }}"#, "0"),
    ]);
}

#[test]
fn to_json_writes_what_go_writes() {
    check(&[
        (
            r#"{{ dict "b" (list "x" true .missing) "a" 1 | toJson }}"#,
            r#"{"a":1,"b":["x",true,null]}"#,
        ),
        // encoding/json escapes HTML characters; toRawJson does not.
        (r#"{{ toJson "<a&b>" }}"#, r#""\u003ca\u0026b\u003e""#),
        (r#"{{ toRawJson "<a&b>" }}"#, r#""<a&b>""#),
        (r#"{{ toJson "a\"b\\c\n\u0001" }}"#, r#""a\"b\\c\n\u0001""#),
        (r#"{{ toRawJson "\u2028" }}"#, r#""\u2028""#),
        (
            "{{ toJson 1.5 }} {{ toJson 2.0 }} {{ toJson 1e21 }} {{ toJson 0.0000001 }}",
            "1.5 2 1e+21 1e-7",
        ),
        (
            "{{ toJson (list) }} {{ toJson (dict) }} {{ toJson .missing }}",
            "[] {} null",
        ),
        (
            r#"{{ dict "a" (list 1 2) "b" (dict) | toPrettyJson }}"#,
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}",
        ),
        (r#"{{ dict "k" "<v>" | mustToRawJson }}"#, r#"{"k":"<v>"}"#),
    ]);
    // NaN has no JSON form: toJson gives "", toRawJson and mustToJson fail.
    check(&[(r#"{{ float64 "NaN" | toJson }}"#, "")]);
    assert!(failure(r#"{{ float64 "NaN" | mustToJson }}"#).contains("no JSON form"));
    assert!(failure(r#"{{ float64 "NaN" | toRawJson }}"#).contains("no JSON form"));
}

#[test]
fn from_json() {
    check(&[
        (
            r#"{{ (fromJson "{\"a\": [1, 2.5, \"x\"]}").a }}"#,
            "[1 2.5 x]",
        ),
        (r#"{{ fromJson "not json" }}"#, "<no value>"),
        (r#"{{ (mustFromJson "{\"a\": 1}").a }}"#, "1"),
        (r#"{{ fromJsonArray "[1, 2]" }}"#, "[1 2]"),
    ]);
    assert!(
        failure(r#"{{ mustFromJson "{" }}"#).contains("mustFromJson: the text is not valid JSON")
    );
}

#[test]
fn to_yaml_writes_helm_style_yaml() {
    let data = json!({"x": {
        "b": [1, "two", {"c": true, "d": null}],
        "a": {"nested": "value"},
        "empty": {},
        "none": [],
        "text": "line1\nline2",
        "quoted": "true",
        "port": "8080",
    }});
    let expected = "\
a:
  nested: value
b:
- 1
- two
- c: true
  d: null
empty: {}
none: []
port: \"8080\"
quoted: \"true\"
text: |-
  line1
  line2";
    assert_eq!(render_with("{{ .x | toYaml }}", data.clone()), expected);
    assert_eq!(
        render_with("spec:\n  {{- .x.a | toYaml | nindent 2 }}", data),
        "spec:\n  nested: value"
    );
    check(&[
        (r#"{{ toYaml "abc" }}"#, "abc"),
        ("{{ toYaml .missing }}", "null"),
        ("{{ list (list 1 2) 3 | toYaml }}", "- - 1\n  - 2\n- 3"),
        ("{{ toYaml 1.5 }}", "1.5"),
    ]);
}

/// Strings YAML could misread come back as the same strings.
#[test]
fn to_yaml_round_trips_tricky_strings() {
    let tricky = [
        "",
        " lead",
        "trail ",
        "yes",
        "no",
        "on",
        "null",
        "~",
        "true",
        "1.0",
        "012",
        "0x1F",
        "1e3",
        "1_000",
        ".inf",
        "-",
        "- x",
        "a: b",
        "a #b",
        "#x",
        "x:",
        "[a]",
        "{a}",
        "*a",
        "&a",
        "!a",
        "|",
        ">",
        "'q'",
        "\"q\"",
        "%x",
        "@x",
        "`x`",
        "2001-12-14",
        "1:20",
        "<<",
        "tab\there",
        "multi\nline",
        "multi\nline\n",
        "trailing space \nline",
        "\nleading break",
        "ünïcödé",
        "a,b",
        "back\\slash",
    ];
    for s in tricky {
        let out = render_with("{{ .x | toYaml }}", json!({"x": {"k": s, s: "key"}}));
        let back = super::json::read_yaml(&out).unwrap_or_else(|| panic!("{s:?} gave {out:?}"));
        assert_eq!(back, json!({"k": s, s: "key"}), "{s:?} gave {out:?}");
    }
}

#[test]
fn from_yaml() {
    check(&[
        ("{{ (fromYaml \"a: 1\\nb: [x, y]\").b }}", "[x y]"),
        (r#"{{ fromYaml "" }}"#, "map[]"),
        (
            r#"{{ (fromYaml "- a").Error }}"#,
            "error: the YAML text is not a mapping",
        ),
        (r#"{{ fromYamlArray "[1, a]" }}"#, "[1 a]"),
    ]);
}

#[test]
fn types_and_equality() {
    check(&[
        (
            "{{ typeOf 1 }} {{ typeOf 1.5 }} {{ typeOf \"a\" }} {{ typeOf true }}",
            "int float64 string bool",
        ),
        (
            "{{ typeOf (list) }}|{{ typeOf (dict) }}|{{ typeOf .missing }}",
            "[]interface {}|map[string]interface {}|<nil>",
        ),
        (
            "{{ kindOf (list) }} {{ kindOf (dict) }} {{ kindOf 1 }} {{ kindOf .missing }}",
            "slice map int invalid",
        ),
        (
            r#"{{ kindIs "string" "a" }} {{ typeIs "int" 1 }} {{ typeIsLike "int" 1 }}"#,
            "true true true",
        ),
        (
            "{{ deepEqual (list 1 (dict \"a\" 2)) (list 1 (dict \"a\" 2)) }}",
            "true",
        ),
        // reflect.DeepEqual compares types: an int is not a float.
        (
            "{{ deepEqual 1 1.0 }} {{ deepEqual (list 1) (list 2) }}",
            "false false",
        ),
        (
            "{{ $a := dict \"k\" 1 }}{{ $b := deepCopy $a }}{{ deepEqual $a $b }}",
            "true",
        ),
    ]);
}

#[test]
fn list_functions() {
    check(&[
        ("{{ list 1 2 3 }}", "[1 2 3]"),
        ("{{ list 1 2 3 | first }} {{ list 1 2 3 | last }}", "1 3"),
        (
            "{{ list 1 2 3 | rest }} {{ list 1 2 3 | initial }}",
            "[2 3] [1 2]",
        ),
        (
            "{{ first (list) }} {{ rest (list) }} {{ initial (list) }}",
            "<no value> [] []",
        ),
        (
            "{{ append (list 1) 2 }} {{ push (list 1) 2 }} {{ prepend (list 2) 1 }}",
            "[1 2] [1 2] [1 2]",
        ),
        ("{{ concat (list 1) (list 2 3) (list) }}", "[1 2 3]"),
        ("{{ reverse (list 1 2 3) }}", "[3 2 1]"),
        ("{{ uniq (list 1 1 2 1 \"1\") }}", "[1 2 1]"),
        ("{{ without (list 1 2 3 2) 2 }}", "[1 3]"),
        (
            "{{ has 2 (list 1 2) }} {{ has 5 (list 1 2) }} {{ has 2 .missing }}",
            "true false false",
        ),
        (r#"{{ compact (list 1 "" 0 "a" .missing false) }}"#, "[1 a]"),
        (
            "{{ slice (list 1 2 3 4 5) 1 3 }} {{ slice (list 1 2 3 4 5) 3 }} {{ slice (list 1 2) }}",
            "[2 3] [4 5] [1 2]",
        ),
        ("{{ slice (list) }}", "<no value>"),
        (r#"{{ slice "hello" 1 3 }}"#, "el"),
        ("{{ chunk 2 (list 1 2 3 4 5) }}", "[[1 2] [3 4] [5]]"),
        ("{{ chunk 2 (list) }}", "[]"),
    ]);
    assert!(failure("{{ slice (list 1 2) 1 5 }}").contains("slice: the indexes are out of range"));
    let message = failure(r#"{{ first "abc" }}"#);
    assert!(
        message.contains("first: the 1st argument must be a list, not a string"),
        "{message}"
    );
    assert!(failure("{{ first .missing }}").contains("not nil (a missing key?)"));
    assert!(failure("{{ chunk 0 (list 1) }}").contains("chunk"));
}

#[test]
fn dict_functions() {
    check(&[
        (r#"{{ dict "a" 1 "b" "x" }}"#, "map[a:1 b:x]"),
        (r#"{{ dict "a" }}"#, "map[a:]"),
        ("{{ dict 1 2 }}", "map[1:2]"),
        (
            r#"{{ get (dict "a" 1) "a" }}|{{ get (dict) "x" }}|{{ get .missing "x" }}"#,
            "1||",
        ),
        (
            r#"{{ hasKey (dict "a" 1) "a" }} {{ hasKey (dict "a" 1) "b" }} {{ hasKey .missing "a" }}"#,
            "true false false",
        ),
        (r#"{{ unset (dict "a" 1 "b" 2) "a" }}"#, "map[b:2]"),
        (
            r#"{{ pluck "a" (dict "a" 1) (dict "b" 2) (dict "a" 3) }}"#,
            "[1 3]",
        ),
        (r#"{{ keys (dict "b" 1 "a" 2) | sortAlpha }}"#, "[a b]"),
        (r#"{{ keys (dict "b" 1) (dict "a" 2 "b" 3) }}"#, "[b a b]"),
        (r#"{{ values (dict "b" 1 "a" 2) }}"#, "[2 1]"),
        (
            r#"{{ pick (dict "a" 1 "b" 2 "c" 3) "a" "c" "z" }}"#,
            "map[a:1 c:3]",
        ),
        (r#"{{ omit (dict "a" 1 "b" 2 "c" 3) "a" "c" }}"#, "map[b:2]"),
    ]);
}

#[test]
fn dig_walks_nested_dicts() {
    let data = json!({"x": {"a": {"b": "v", "s": "text"}}});
    assert_eq!(
        render_with(r#"{{ dig "a" "b" "def" .x }}"#, data.clone()),
        "v"
    );
    assert_eq!(
        render_with(r#"{{ dig "a" "z" "def" .x }}"#, data.clone()),
        "def"
    );
    assert_eq!(
        render_with(r#"{{ .x | dig "a" "b" "c" "def" }}"#, json!({"x": {}})),
        "def"
    );
    assert_eq!(
        render_with(r#"{{ dig "a" (dict) .x }}"#, data.clone()),
        "map[b:v s:text]"
    );
    let message = failure_with(r#"{{ dig "a" "s" "t" "def" .x }}"#, data);
    assert!(
        message.contains("dig: the value at key 2 of the path is a string"),
        "{message}"
    );
    assert!(
        failure(r#"{{ dig "a" "def" .missing }}"#)
            .contains("dig: the last argument must be a dict")
    );
}

#[test]
fn set_changes_the_variable_it_is_given() {
    check(&[
        (
            r#"{{ $d := dict }}{{ $_ := set $d "k" "v" }}{{ $d }}"#,
            "map[k:v]",
        ),
        (
            r#"{{ $d := dict "a" 1 }}{{ $_ := unset $d "a" }}{{ $d }}"#,
            "map[]",
        ),
        // Inside a loop, on the variable declared outside it.
        (
            r#"{{ $d := dict }}{{ range $i, $n := list "a" "b" }}{{ $_ := set $d $n $i }}{{ end }}{{ $d | toJson }}"#,
            r#"{"a":0,"b":1}"#,
        ),
        // A field path under a variable: each level is set again.
        (
            r#"{{ $d := dict "a" (dict "b" 1) }}{{ $_ := set $d.a "c" 2 }}{{ $d | toJson }}"#,
            r#"{"a":{"b":1,"c":2}}"#,
        ),
        (
            r#"{{ $d := dict "a" (dict) }}{{ $r := set $d.a "c" 2 }}{{ $r | toJson }}"#,
            r#"{"c":2}"#,
        ),
        // The value is still what set returns, through a pipeline.
        (
            r#"{{ $d := dict }}{{ set $d "k" 1 | toJson }} {{ $d | toJson }}"#,
            r#"{"k":1} {"k":1}"#,
        ),
        (
            r#"{{ $d := dict }}{{ 5 | set $d "k" | toJson }}"#,
            r#"{"k":5}"#,
        ),
        (r#"{{ set (dict) "k" 1 }}"#, "map[k:1]"),
    ]);
    assert!(
        failure(r#"{{ $d := .missing }}{{ $_ := set $d "k" 1 }}"#).contains("set: the dict is nil")
    );
}

#[test]
fn merge_follows_mergo() {
    let data = json!({
        "dst": {"a": "", "b": false, "c": "keep", "l": [1], "n": {"y": 2}, "z": 0},
        "src": {"a": "x", "b": true, "c": "src", "l": [2], "n": {"x": 1}, "d": "new", "z": null},
    });
    // Empty values in dst are replaced; set ones are kept; dicts merge.
    assert_eq!(
        render_with("{{ merge .dst .src | toJson }}", data.clone()),
        r#"{"a":"x","b":true,"c":"keep","d":"new","l":[1],"n":{"x":1,"y":2},"z":0}"#
    );
    // mergeOverwrite: src wins wherever it is set, a nil included.
    assert_eq!(
        render_with("{{ mergeOverwrite .dst .src | toJson }}", data.clone()),
        r#"{"a":"x","b":true,"c":"src","d":"new","l":[2],"n":{"x":1,"y":2},"z":null}"#
    );
    assert_eq!(
        render_with(
            r#"{{ mergeOverwrite (dict "on" true) (dict "on" false) | toJson }}"#,
            data.clone()
        ),
        r#"{"on":false}"#
    );
    // The first source wins over the later ones; the dst variable is changed.
    assert_eq!(
        render_with(
            r#"{{ $d := dict }}{{ $_ := merge $d (dict "a" 1) (dict "a" 2 "b" 3) }}{{ $d | toJson }}"#,
            data
        ),
        r#"{"a":1,"b":3}"#
    );
}

#[test]
fn base64_and_base32() {
    check(&[
        (r#"{{ b64enc "coffee" }}"#, "Y29mZmVl"),
        (r#"{{ b64dec "Y29mZmVl" }}"#, "coffee"),
        (r#"{{ b64dec "Y29m\nZmVl" }}"#, "coffee"),
        (
            r#"{{ b64dec "!!!!" }}"#,
            "illegal base64 data at input byte 0",
        ),
        (r#"{{ b32enc "coffee" }}"#, "MNXWMZTFMU======"),
        (r#"{{ b32enc "hello world" }}"#, "NBSWY3DPEB3W64TMMQ======"),
        (r#"{{ b32dec "MNXWMZTFMU======" }}"#, "coffee"),
        (r#"{{ b32dec "ME======" }}"#, "a"),
        (
            r#"{{ b32dec "ME" }}"#,
            "illegal base32 data at input byte 0",
        ),
    ]);
}

#[test]
fn hashes() {
    check(&[
        (
            r#"{{ sha256sum "hello" }}"#,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
        ),
        (
            r#"{{ sha1sum "hello" }}"#,
            "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d",
        ),
        (
            r#"{{ repeat 100 "a" | sha1sum }}"#,
            "7f9000257a4918d7072655ea468540cdcbd42e0c",
        ),
        (
            r#"{{ sha512sum "hello" }}"#,
            "9b71d224bd62f3785d96d46ad3ea3d73319bfbc2890caadae2dff72519673ca72323c3d99ba5c11d7c7acc6e14b8c5da0c4663475c2e5c3adef46f73bcdec043",
        ),
        (r#"{{ adler32sum "hello" }}"#, "103547413"),
    ]);
}

#[test]
fn url_parse_and_join() {
    let parsed = render(
        r#"{{ $u := urlParse "http://user:pa%40ss@example.com:8080/a%20b/x?q=1#frag" }}{{ $u.scheme }}|{{ $u.host }}|{{ $u.hostname }}|{{ $u.path }}|{{ $u.query }}|{{ $u.fragment }}|{{ $u.userinfo }}|{{ $u.opaque }}"#,
    );
    assert_eq!(
        parsed,
        "http|example.com:8080|example.com|/a b/x|q=1|frag|user:pa%40ss|"
    );
    check(&[
        (r#"{{ (urlParse "mailto:x@y.z").opaque }}"#, "x@y.z"),
        (r#"{{ (urlParse "https://[::1]:443/").hostname }}"#, "::1"),
        (
            r#"{{ urlJoin (dict "scheme" "https" "host" "h:1" "path" "/a b" "query" "x=1" "fragment" "f" "userinfo" "u:p@ss") }}"#,
            "https://u:p%40ss@h:1/a%20b?x=1#f",
        ),
        (
            r#"{{ urlJoin (dict "host" "example.com" "path" "x") }}"#,
            "//example.com/x",
        ),
        (
            r#"{{ urlJoin (dict "scheme" "http" "host" "h") }}"#,
            "http://h",
        ),
    ]);
    assert!(
        failure(r#"{{ urlParse "http://h:port" }}"#).contains("urlParse: the text is not a URL")
    );
    assert!(
        failure(r#"{{ urlJoin (dict "host" 1) }}"#)
            .contains("urlJoin: the host key must be a string")
    );
}

#[test]
fn paths() {
    check(&[
        (
            r#"{{ base "/a/b.txt" }} {{ base "" }} {{ base "/" }} {{ base "a/" }}"#,
            "b.txt . / a",
        ),
        (
            r#"{{ dir "/a/b.txt" }} {{ dir "a" }} {{ dir "/a" }}"#,
            "/a . /",
        ),
        (
            r#"{{ clean "a//b/../c/." }} {{ clean "" }} {{ clean "/../a" }} {{ clean "../../a" }}"#,
            "a/c . /a ../../a",
        ),
        (r#"{{ ext "a/b.tar.gz" }}|{{ ext "a.d/b" }}"#, ".gz|"),
        (
            r#"{{ isAbs "/a" }} {{ isAbs "a" }} {{ osBase "/x/y" }}"#,
            "true false y",
        ),
    ]);
}

#[test]
fn go_builtins_keep_go_semantics() {
    check(&[
        (r#"{{ print 1 2 "a" 3 "b" }}"#, "1 2a3b"),
        (r#"{{ println "a" 1 }}"#, "a 1\n"),
        (
            r#"{{ printf "%s-%d-%05.1f-%q" "a" 5 3.14159 "x" }}"#,
            "a-5-003.1-\"x\"",
        ),
        (r#"{{ printf "%v" .missing }}"#, "<nil>"),
        (r#"{{ html "<a href='x'>" }}"#, "&lt;a href=&#39;x&#39;&gt;"),
        (r#"{{ js "a'b" }}"#, "a\\'b"),
        (r#"{{ urlquery "a b&c" }}"#, "a+b%26c"),
        (
            r#"{{ eq "a" "a" }} {{ eq 1 2 1 }} {{ ne 1 2 }} {{ eq .missing .missing }}"#,
            "true true true true",
        ),
        (
            r#"{{ lt 1 2 }} {{ le 2 2 }} {{ gt "b" "a" }} {{ ge 1.5 2.5 }}"#,
            "true true true false",
        ),
        (
            r#"{{ if and .missing (index .missing 0) }}x{{ else }}y{{ end }}"#,
            "y",
        ),
    ]);
    let message = failure(r#"{{ eq 1 "a" }}"#);
    assert!(
        message.contains("incompatible types for comparison: int and string"),
        "{message}"
    );
    assert!(failure("{{ eq (list) (list) }}").contains("non-comparable type list"));
    let message = failure(r#"{{ printf "%s" }}{{ printf (list 1) }}"#);
    assert!(
        message.contains("printf: the 1st argument must be a string, not a list"),
        "{message}"
    );
}

#[test]
fn every_function_has_a_name_the_parser_accepts() {
    for name in super::implemented() {
        if name.starts_with("_gitplane") {
            continue;
        }
        // Parsing checks the name is known; arguments are not checked until a render.
        GoTemplate::parse(
            "t",
            &format!("{{{{ if false }}}}{{{{ {name} }}}}{{{{ end }}}}"),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

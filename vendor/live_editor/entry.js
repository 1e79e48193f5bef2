// The book's code editor for Live code (docs/_static/live_code.js loads the bundle built from this file when the
// reader presses "Live code"). CodeMirror 6 with the Python grammar; its highlighting gives each token the class
// Pygments gives it, inside a `.highlight` box, so the page's own Pygments colours (both modes) apply unchanged.
import { EditorState, Prec, RangeSetBuilder } from "@codemirror/state";
import { Decoration, EditorView, ViewPlugin, keymap, drawSelection } from "@codemirror/view";
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { syntaxHighlighting, syntaxTree, indentUnit, bracketMatching } from "@codemirror/language";
import { pythonLanguage } from "@codemirror/lang-python";
import { tags as t, tagHighlighter } from "@lezer/highlight";

// Lezer's tags -> Pygments' short classes (pygments/token.py STANDARD_TYPES), as Pygments' Python lexer uses them.
const pygments = tagHighlighter([
  { tag: [t.keyword, t.controlKeyword, t.definitionKeyword], class: "k" },
  { tag: t.moduleKeyword, class: "kn" },
  { tag: t.operatorKeyword, class: "ow" },
  { tag: [t.bool, t.null], class: "kc" },
  { tag: t.self, class: "bp" },
  { tag: t.comment, class: "c1" },
  { tag: t.docString, class: "sd" },
  { tag: t.string, class: "s2" },
  { tag: t.special(t.string), class: "s2" },
  { tag: t.escape, class: "se" },
  { tag: t.number, class: "mf" },
  { tag: t.function(t.definition(t.variableName)), class: "nf" },
  { tag: t.definition(t.className), class: "nc" },
  { tag: t.standard(t.variableName), class: "nb" },
  { tag: t.meta, class: "nd" },
  { tag: [t.operator, t.updateOperator, t.compareOperator, t.arithmeticOperator, t.logicOperator,
          t.bitwiseOperator], class: "o" },
  { tag: [t.punctuation, t.paren, t.squareBracket, t.brace, t.separator, t.derefOperator], class: "p" },
  { tag: [t.variableName, t.propertyName, t.className], class: "n" },
]);

// The page's fonts and colours (pydata-sphinx-theme's variables), so both colour modes keep their contrast.
const theme = EditorView.theme({
  "&": { color: "var(--pst-color-text-base)", fontSize: "0.875em" },
  ".cm-scroller": { fontFamily: "var(--pst-font-family-monospace)", lineHeight: "1.4" },
  ".cm-content": { padding: "0.5rem 0", caretColor: "var(--pst-color-text-base)" },
  ".cm-line": { padding: "0 0.5rem" },
  ".cm-cursor, .cm-dropCursor": { borderLeftColor: "var(--pst-color-text-base)" },
  "&.cm-focused": { outline: "3px solid var(--pst-color-accent)", outlineOffset: "1px" },
  ".cm-selectionBackground, &.cm-focused > .cm-scroller > .cm-selectionLayer .cm-selectionBackground":
    { background: "rgba(128, 128, 128, 0.35)" },
  ".cm-matchingBracket, &.cm-focused .cm-matchingBracket": { background: "rgba(128, 128, 128, 0.3)", color: "inherit" },
});

// Where Pygments and the grammar's tags part ways: an f-string's braces and format spec, and Python's builtins as
// Pygments classes them (nb functions and types, ne exceptions, bp, kc), which the grammar
// does not tell apart from other names: from Pygments' Python lexer run on dir(builtins) (Python 3.11).
const BUILTINS = {"ne":["ArithmeticError","AssertionError","AttributeError","BaseException","BlockingIOError","BrokenPipeError","BufferError","BytesWarning","ChildProcessError","ConnectionAbortedError","ConnectionError","ConnectionRefusedError","ConnectionResetError","DeprecationWarning","EOFError","EncodingWarning","EnvironmentError","Exception","FileExistsError","FileNotFoundError","FloatingPointError","FutureWarning","GeneratorExit","IOError","ImportError","ImportWarning","IndentationError","IndexError","InterruptedError","IsADirectoryError","KeyError","KeyboardInterrupt","LookupError","MemoryError","ModuleNotFoundError","NameError","NotADirectoryError","NotImplementedError","OSError","OverflowError","PendingDeprecationWarning","PermissionError","ProcessLookupError","RecursionError","ReferenceError","ResourceWarning","RuntimeError","RuntimeWarning","StopAsyncIteration","StopIteration","SyntaxError","SyntaxWarning","SystemError","SystemExit","TabError","TimeoutError","TypeError","UnboundLocalError","UnicodeDecodeError","UnicodeEncodeError","UnicodeError","UnicodeTranslateError","UnicodeWarning","UserWarning","ValueError","Warning","ZeroDivisionError"],"bp":["Ellipsis","NotImplemented"],"kc":["False","None","True"],"nb":["abs","aiter","all","any","bin","bool","breakpoint","bytearray","bytes","callable","chr","classmethod","compile","complex","delattr","dict","dir","divmod","enumerate","eval","filter","float","format","frozenset","getattr","globals","hasattr","hash","hex","id","input","int","isinstance","issubclass","iter","len","list","locals","map","max","memoryview","min","next","object","oct","open","ord","pow","print","property","range","repr","reversed","round","set","setattr","slice","sorted","staticmethod","str","sum","super","tuple","type","vars","zip"]};
const builtinClass = new Map(Object.entries(BUILTINS).flatMap(([name, words]) => words.map((w) => [w, name])));

function builtinMarks(view) {
  const marks = new RangeSetBuilder();
  for (const { from, to } of view.visibleRanges) {
    syntaxTree(view.state).iterate({ from, to, enter: (node) => {
      let name;
      if (node.name === "VariableName") name = builtinClass.get(view.state.doc.sliceString(node.from, node.to));
      else if (node.name === "FormatSpec") name = "s2"; // the grammar's modifier tag, shared with async and *
      else if ((node.name === "{" || node.name === "}") && node.node.parent?.name === "FormatReplacement") name = "si";
      if (name) marks.add(node.from, node.to, Decoration.mark({ class: name }));
    } });
  }
  return marks.finish();
}

// Innermost (highest precedence), so its class decides the colour over the grammar's plain-name class.
const builtins = Prec.highest(ViewPlugin.fromClass(class {
  constructor(view) { this.decorations = builtinMarks(view); }
  update(update) {
    if (update.docChanged || update.viewportChanged || syntaxTree(update.startState) !== syntaxTree(update.state)) {
      this.decorations = builtinMarks(update.view);
    }
  }
}, { decorations: (plugin) => plugin.decorations }));

// parent: where the editor goes; source: its text; label: its accessible name; run(): Shift+Enter / Ctrl+Enter.
export function createEditor(parent, source, label, run) {
  const runKey = () => { run(); return true; };
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc: source,
      extensions: [
        history(),
        drawSelection(),
        bracketMatching(),
        indentUnit.of("    "),
        keymap.of([{ key: "Shift-Enter", run: runKey }, { key: "Mod-Enter", run: runKey },
                   ...defaultKeymap, ...historyKeymap, indentWithTab]),
        pythonLanguage,
        syntaxHighlighting(pygments),
        theme,
        builtins,
        EditorView.lineWrapping, // long lines wrap: no scrolling region, as axe asks of one without focusable content
        EditorView.contentAttributes.of({ "aria-label": label, "aria-multiline": "true" }),
      ],
    }),
  });
  return {
    view,
    get value() { return view.state.doc.toString(); },
    set value(text) { view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } }); },
    focus() { view.focus(); },
  };
}

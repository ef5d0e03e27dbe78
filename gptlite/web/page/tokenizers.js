// The page's tokenizers: text to ids and back, as gptlite's, from the forms web/tokenizer_form.py writes
// (characters, byte-level BPE, SentencePiece BPE). Nothing here knows the page: Node imports it to check the
// tokenizers against Python's.

function addedPattern(added) {
  // Added tokens (turn markers) are one token wherever they stand, the longest first.
  if (added.length === 0) return null;
  const escaped = [...added].sort((a, b) => b.length - a.length).map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  return new RegExp(`(${escaped.join("|")})`, "u");
}

function aroundAdded(text, pattern, addedIds, encodePlain) {
  if (pattern === null) return encodePlain(text);
  const ids = [];
  text.split(pattern).forEach((part, index) => {
    if (index % 2) ids.push(addedIds.get(part));
    else if (part) ids.push(...encodePlain(part));
  });
  return ids;
}

export class CharacterTokenizer {
  constructor(form) {
    this.specials = form.specials;
    this.characters = form.characters;
    this.added = form.added;
    this.ids = new Map(this.characters.map((c, i) => [c, i + this.specials.length]));
    const first = this.specials.length + this.characters.length;
    this.addedIds = new Map(this.added.map((t, i) => [t, first + i]));
    this.pattern = addedPattern(this.added);
    this.texts = [...this.specials.map(() => ""), ...this.characters, ...this.added];
  }

  // The characters of `text` that have no id, in order of first appearance.
  unknownCharacters(text) {
    const plain = this.pattern === null ? text : text.split(this.pattern).filter((_, i) => i % 2 === 0).join("");
    return [...new Set([...plain].filter((c) => !this.ids.has(c)))];
  }

  encode(text) {
    return aroundAdded(text, this.pattern, this.addedIds, (part) => [...part].map((c) => {
      const id = this.ids.get(c);
      if (id === undefined) throw new Error(`the text has characters the model's vocabulary lacks: ${c}`);
      return id;
    }));
  }

  // A decoder that turns ids into text as they come (characters need no waiting).
  decoder() {
    return { add: (id) => this.texts[id] ?? "", finish: () => "" };
  }

  piece(id) { return id < this.specials.length ? this.specials[id] : this.texts[id] ?? ""; }
}

// GPT-2's byte-level alphabet: each byte as one printable character.
function byteAlphabet() {
  const visible = [];
  for (let b = 33; b <= 126; b++) visible.push(b);
  for (let b = 161; b <= 172; b++) visible.push(b);
  for (let b = 174; b <= 255; b++) visible.push(b);
  const toCharacter = new Array(256);
  let hidden = 0;
  for (let b = 0; b < 256; b++) {
    toCharacter[b] = visible.includes(b) ? String.fromCharCode(b) : String.fromCharCode(256 + hidden++);
  }
  return toCharacter;
}

// A tokenizer whose tokens are bytes (`bytesOf(id)`): its text decoded as UTF-8, a character's first bytes held
// back until its last.
class BytesTokenizer {
  decoder() {
    const utf8 = new TextDecoder("utf-8");
    return { add: (id) => utf8.decode(this.bytesOf(id), { stream: true }), finish: () => utf8.decode() };
  }

  piece(id) { return new TextDecoder("utf-8").decode(this.bytesOf(id)); }
}

// BPE's merges over a word's symbols: the adjacent pair of lowest rank merged, everywhere, again and again.
function merged(symbols, ranks) {
  let parts = symbols;
  while (parts.length > 1) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i < parts.length - 1; i++) {
      const rank = ranks.get(`${parts[i]} ${parts[i + 1]}`);
      if (rank !== undefined && rank < bestRank) { bestRank = rank; best = i; }
    }
    if (best < 0) break;
    const [left, right] = [parts[best], parts[best + 1]];
    const next = [];
    for (let i = 0; i < parts.length; i++) {
      if (i < parts.length - 1 && parts[i] === left && parts[i + 1] === right) { next.push(left + right); i++; }
      else next.push(parts[i]);
    }
    parts = next;
  }
  return parts;
}

export class ByteLevelBPE extends BytesTokenizer {
  constructor(form) {
    super();
    this.vocabulary = new Map(Object.entries(form.vocabulary));
    this.ranks = new Map(form.merges.map((merge, rank) => [merge, rank]));
    this.ignoreMerges = form.ignore_merges;
    this.splits = form.splits.map((pattern) => new RegExp(pattern, "gu"));
    this.addedIds = new Map(Object.entries(form.added));
    this.pattern = addedPattern([...this.addedIds.keys()]);
    this.byteCharacter = byteAlphabet();
    this.characterByte = new Map(this.byteCharacter.map((c, b) => [c, b]));
    this.tokens = [];
    for (const [token, id] of this.vocabulary) this.tokens[id] = token;
    this.addedById = new Map([...this.addedIds].map(([token, id]) => [id, token]));
    this.encoder = new TextEncoder();
    this.cache = new Map();
  }

  unknownCharacters() { return []; }  // every text is bytes, and every byte has a token

  encode(text) {
    return aroundAdded(text, this.pattern, this.addedIds, (part) => {
      const ids = [];
      for (const piece of this.split(part)) ids.push(...this.word(piece));
      return ids;
    });
  }

  // The splitting steps in turn: each isolates its matches from the text between them.
  split(text) {
    let pieces = [text];
    for (const pattern of this.splits) {
      const next = [];
      for (const piece of pieces) {
        let last = 0;
        for (const match of piece.matchAll(pattern)) {
          if (match[0].length === 0) continue;
          if (match.index > last) next.push(piece.slice(last, match.index));
          next.push(match[0]);
          last = match.index + match[0].length;
        }
        if (last < piece.length) next.push(piece.slice(last));
      }
      pieces = next;
    }
    return pieces;
  }

  // One piece's ids: its bytes as alphabet characters, merged pair by pair, the pair of lowest rank first.
  word(piece) {
    const known = this.cache.get(piece);
    if (known) return known;
    const characters = [...this.encoder.encode(piece)].map((b) => this.byteCharacter[b]);
    const whole = characters.join("");
    if (this.ignoreMerges && this.vocabulary.has(whole)) return [this.vocabulary.get(whole)];
    const ids = merged(characters, this.ranks).map((part) => {
      const id = this.vocabulary.get(part);
      if (id === undefined) throw new Error(`the tokenizer has no token for ${JSON.stringify(part)}`);
      return id;
    });
    if (this.cache.size < 100000) this.cache.set(piece, ids);
    return ids;
  }

  bytesOf(id) {
    const added = this.addedById.get(id);
    if (added !== undefined) return this.encoder.encode(added);
    const token = this.tokens[id] ?? "";
    return Uint8Array.from([...token].map((c) => this.characterByte.get(c) ?? 0));
  }

}

// SentencePiece-style BPE (Llama's, TinyLlama's): "▁" before each text and for each space, merges over the whole
// text, and a character the vocabulary lacks as its UTF-8 bytes, tokens <0x00> to <0xFF>.
export class SentencePieceBPE extends BytesTokenizer {
  constructor(form) {
    super();
    this.vocabulary = new Map(Object.entries(form.vocabulary));
    this.ranks = new Map(form.merges.map((merge, rank) => [merge, rank]));
    this.addedIds = new Map(Object.entries(form.added));
    this.pattern = addedPattern([...this.addedIds.keys()]);
    this.unknown = form.unknown;
    this.tokens = [];
    for (const [token, id] of this.vocabulary) this.tokens[id] = token;
    for (const [token, id] of this.addedIds) this.tokens[id] = token;
    this.encoder = new TextEncoder();
  }

  unknownCharacters() { return []; }  // a character it lacks is its bytes

  encode(text) {
    return aroundAdded(text, this.pattern, this.addedIds, (part) => {
      const ids = [];
      for (const symbol of merged([..."▁" + part.replaceAll(" ", "▁")], this.ranks)) {
        const id = this.vocabulary.get(symbol);
        if (id !== undefined) { ids.push(id); continue; }
        for (const byte of this.encoder.encode(symbol)) {
          const hex = byte.toString(16).toUpperCase().padStart(2, "0");
          ids.push(this.vocabulary.get(`<0x${hex}>`) ?? this.unknown);
        }
      }
      return ids;
    });
  }

  bytesOf(id) {
    const token = this.tokens[id] ?? "";
    const byte = /^<0x([0-9A-F]{2})>$/.exec(token);
    if (byte) return Uint8Array.of(parseInt(byte[1], 16));
    return this.encoder.encode(this.addedIds.has(token) ? token : token.replaceAll("▁", " "));
  }

}

export function makeTokenizer(form) {
  if (form.kind === "characters") return new CharacterTokenizer(form);
  if (form.kind === "byte_level_bpe") return new ByteLevelBPE(form);
  if (form.kind === "sentencepiece_bpe") return new SentencePieceBPE(form);
  throw new Error(`no tokenizer of kind ${form.kind}`);
}


"""The default routing rules' patterns (gateway/config/routing.py puts them in order).

Each is searched case-insensitively in the ask's instruction (gateway/routing/ask.py); a match
inside quotation marks does not count, and a match whose sentence, or the sentence after it,
holds the rule's `unless` pattern does not count either (gateway/routing/rules.py). The words
are the ways users put these requests in English, Chinese, Japanese, Korean, German, French,
Spanish, Portuguese and Russian.
"""

from __future__ import annotations

# Where a sentence starts, and the greetings and polite leads allowed before its verb:
# "thanks! can you prove ...", "问一下：证明：", "bitte beweise", "¿puedes demostrar ...".
_START = r"(?:^|[.!?;¿¡]\s*|\n)\s*"
_LEADS = (
    r"(?:(?:thanks|thank you|thx|ok|okay|hi|hello|hey|so|now|also|and|question|quick question"
    r"|hallo|danke|frage|bonjour|merci|salut|question|hola|gracias|pregunta|olá|ola|obrigad[oa]"
    r"|pergunta|привет|спасибо|вопрос)[,!.:]?\s+)*"
    r"(?:(?:please|can you|could you|would you|try to|help me|i need you to|i want you to|now"
    r"|bitte|kannst du|können sie|könntest du|pouvez-vous|peux-tu|pourriez-vous|s'il te plaît"
    r"|por favor|puedes|podrías|podrias|pode|você pode|voce pode|пожалуйста|можешь|можете)"
    r"[,]?\s+)*"
)
_PROVE_VERBS = (
    r"(?:prove|show that|disprove|give a proof|write a proof"
    r"|beweise|beweisen sie|zeige,? dass|zeigen sie,? dass|weise nach"
    r"|démontre[rz]?|prouve[rz]?|montre[rz]? que"
    r"|demuestra|demuestre|demostrar|prueba que|pruebe que|muestra que|muestre que"
    r"|demonstre|demonstrar|prove que|mostre que|mostra que"
    r"|докажи(?:те)?|доказать|покажи(?:те)?,? что)"
)
_ZH_PROVE = (
    r"(?:^|[。！？；\n])\s*(?:(?:谢谢|你好|好的|问一下|请问|题目)[，,！!：:]?\s*)*"
    r"(?:请|试|帮我|麻烦)?(?:证明|求证)"
)
# Japanese and Korean put the verb last: 「…を証明してください」, 「…를 증명하시오」.
_JA_KO_PROVE = (
    r"証明(?:せよ|して(?:ください|下さい|くれ|ほしい|みて)?(?:[。！？!?\s]|$)|しなさい|を(?:書いて|お願い))"
    r"|증명(?:하라|하시오|하세요|하십시오|해\s*(?:줘|주세요|봐|보세요))"
)
# A request to prove, opening a sentence of the ask after at most a greeting or a polite lead;
# not "the logs show that", "who proved", "他说他能证明".
PROOF_REQUEST = rf"{_START}{_LEADS}{_PROVE_VERBS}\b|{_ZH_PROVE}|{_JA_KO_PROVE}"
# ... unless the sentence, or the one after it, makes it a dare or a joke ("can you prove
# you're an AI? haha just kidding"), or says not to ("no need to prove it").
PROOF_REQUEST_UNLESS = (  # words in one group (one boundary test), the rest literals
    r"\b(?:just kidding|j/?k|ha(?:ha)+|lol|kidding|je rigole|je plaisante|bromeo|estoy bromeando"
    r"|nur spaß|spaß|es broma|brincadeira|шучу|dass du|что ты|que tu (?:es|n'es)"
    r"|que (?:eres|no eres|você é|você não é|tu és)\b"
    r"|(?:prove|show)\s+(?:(?:that\s+)?you(?:'re|\s+are|\s+can)?|yourself|it to me|me wrong)"
    r"|(?:no need to|don't|do not|without)\s+(?:\w+\s+)?(?:prove|proving))\b"
    r"|-moi que tu|\bque tu (?:es|n'es)|😂|🤣|너 진짜|お前が|あなたが(?:人間|ai|ロボット)"
    r"|开玩笑|哈哈|不用证明|不需要证明|无需证明|冗談|笑|ㅋㅋ|농담"
)
# Laughter or "just kidding" beside a proof word that no rule above took as a request: a dare or
# banter ("너 진짜 AI 맞는지 증명해 봐 ㅋㅋ 농담이야", "my kid asked me to prove Santa exists lol").
PROOF_JOKE = (  # words in one group (one boundary test), the rest literals
    r"\b(?:just kidding|j/?k|ha(?:ha)+|lol|lmao|je rigole|je plaisante|mdr|broma|bromeo"
    r"|brincadeira|kkk+|шучу|spaß)\b|\b(?:jaja|хаха|scherz)\w*"
    r"|😂|🤣|🙄|开玩笑|哈哈|冗談|ㅋㅋ|농담"
)
# A proof to check, not to write: "check my proof", "is this proof correct", "find the
# mistake in this argument", 检查这个证明, この証明は正しい.
_PROOF_NOUNS = (
    r"(?:proof|derivation|beweis|preuve|démonstration|demostración|demostracion|prueba|prova"
    r"|demonstração|demonstracao|доказательств\w*)"
)
PROOF_CHECK = (
    r"\b(?:check|verify|review|grade|critique|audit|validate|double-check|look over"
    r"|überprüfe|prüfe|prüf|vérifie[rz]?|corrige[rz]?|revisa|verifica|comprueba|confira"
    r"|verifique|revise|проверь(?:те)?)\b[^.?!\n]{0,40}"
    + _PROOF_NOUNS
    + r"|\b(?:is|are)\s+(?:this|my|the|these)\s+(?:proof|argument|derivation|steps?)\s+"
    r"(?:correct|valid|right|sound|rigorous|wrong)"
    r"|\b(?:find|spot|where is|where's)\s+(?:the\s+)?(?:error|mistake|flaw|gap|bug)s?\s+in\s+"
    r"(?:this|my|the)\s+(?:argument|"
    + _PROOF_NOUNS[3:]
    + r"|\bwhere does (?:this|my|the) (?:proof|argument|derivation) (?:go wrong|fail|break)"
    r"|(?:检查|验证|看看|审查|核对|批改)(?:一下)?(?:这个|这段|我的|下面的)?(?:证明|推导|论证)"
    r"|(?:这个|这段|我的)(?:证明|推导|论证)(?:对不对|是否正确|正确吗|有没有问题|哪里错|错在哪)"
    r"|証明(?:を)?(?:チェック|確認|検証|添削)|この証明(?:は|が)(?:正しい|間違)"
    r"|증명(?:을|이)?\s*(?:검토|확인|검증)"
)
# ... unless it is the proof's form that is to be checked ("check my proof for typos").
PROOF_CHECK_UNLESS = (
    r"\b(?:typos?|spelling|grammar|formatting|latex|wording|punctuation)\b"
    r"|错别字|排版|格式|誤字|맞춤법"
)
# A proof to lay out, not to prove or check: "format / typeset / translate this proof",
# 把这个证明排版成 LaTeX, "traduis cette démonstration".
PROOF_EDIT = (
    r"\b(?:format|typeset|translate|reformat|convert|transcribe|latex-?ify|rewrite|paraphrase"
    r"|proofread|copy-?edit|summari[sz]e|clean up|render"
    r"|formatiere|übersetze?|mach aus|traduis|traduire|mets en forme|mets|passe|formatea|traduce"
    r"|traduz|formate|pasa|passa|переведи|оформи)\b[^.?!\n]{0,40}"
    + _PROOF_NOUNS
    + r"|(?:排版|翻译|格式化|转成|转换成|改写|润色|整理)[^。！？\n]{0,20}证明"
    r"|证明[^。！？\n]{0,20}(?:排版|翻译成|格式化|转成|转换成|改成\s*latex)"
    + r"|"
    + _PROOF_NOUNS
    + r"[^.?!\n]{0,40}\b(?:(?:in|into|to|en|a|para|auf|в)\s+latex|latex\s+"
    r"(?:code|format)|numbered list|nummerierte liste|liste numérotée|lista numerada)"
    r"|証明[^。！？\n]{0,20}(?:翻訳|整形|清書)|증명[^.?!\n]{0,20}(?:번역|서식|정리)"
)
# ... unless a check or a proof of its own is asked too ("translate it and check each step").
PROOF_EDIT_UNLESS = (
    r"\b(?:check|verify|correct|valid|gap|error|mistake|flaw|wrong|complete the|finish the"
    r"|fill in|rigou?r\w*|formal(?:ly)?|simplif\w*)\b|检查|验证|对不对|补全|正确|严谨|严格"
)
# What the proof rules require before their patterns are searched (the judge searches for each
# list once, however many rules require it): the verbs of a request to prove, as the pattern
# has them ("show that", not "show": "show me the logs" searches no pattern) ...
PROOF_WORDS = (
    "prove", "show that", "证明", "求证", "証明", "증명", "bewei", "zeig", "weise nach", "démontr",
    "prouv", "montre", "demuestr", "demostr", "prueba que", "pruebe que", "muestra que",
    "muestre que", "demonstr", "mostre que", "mostra que", "доказ", "докаж", "покаж",
)  # fmt: skip
# ... and the nouns of a proof to check or to lay out.
PROOF_NOUN_WORDS = (
    "proof", "argument", "derivation", "证明", "推导", "论证", "証明", "증명", "beweis", "preuve",
    "démonstration", "demostraci", "prueba", "prova", "demonstra", "доказательств",
)  # fmt: skip
# The whole ask is a greeting or thanks (a leading "thanks" before a question decides nothing).
GREETING_ONLY = (
    r"^\s*(?:¡?(?:hi|hello|hey|thanks|thank you|thx|cheers|good (?:morning|evening|night)|"
    r"ok|okay|great|nice|你好|您好|谢谢(?:你|您|啦|了)?|多谢|辛苦了|早上好|晚安|嗨|好的"
    r"|hallo|guten (?:morgen|tag|abend)|danke(?: schön| sehr)?|vielen dank|bonjour|bonsoir|salut"
    r"|merci(?: beaucoup)?|hola|buenos días|buenas (?:tardes|noches)|gracias|muchas gracias|olá"
    r"|ola|bom dia|boa (?:tarde|noite)|obrigad[oa]|muito obrigad[oa]|привет|здравствуйте"
    r"|доброе утро|добрый (?:день|вечер)|спасибо(?: большое)?|こんにちは|こんばんは"
    r"|おはよう(?:ございます)?|ありがとう(?:ございます)?|どうも|안녕하세요|안녕|감사합니다"
    r"|고맙습니다|고마워)"
    r"(?: so much| a lot| all)?"
    r"[\s,!.。！，~～]*)+$"
)
